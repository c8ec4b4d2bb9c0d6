// Copies into memory that will not be read again soon (a collective's output buffer
// when the message is larger than the caches): non-temporal stores skip the
// read-for-ownership a normal store does, so each output byte costs one write to
// memory instead of a read plus a write, and the copy does not evict the inputs and
// slots that the next steps read.
#pragma once

#include <cstddef>

namespace ridge {

// dst and src must not overlap. Ends with a store fence, so the data is ordered before
// any later store (e.g. a flag that tells a peer it may read dst).
void streamCopy(void* dst, const void* src, size_t bytes);

}  // namespace ridge
