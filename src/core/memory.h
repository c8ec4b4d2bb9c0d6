// Where a buffer lives. The collectives run on host memory in this release; device
// memory is recognised so that it is rejected with a clear message instead of being
// dereferenced on the CPU. The GPU data path hooks in here.
#pragma once

namespace ridge {

enum class MemoryKind { Host, Device, Managed };

// Classifies `ptr` with cudaPointerGetAttributes in CUDA builds when a device is
// present; everything is Host otherwise (and in CUDA builds on machines without a GPU).
MemoryKind classifyMemory(const void* ptr);
const char* memoryKindName(MemoryKind kind);

}  // namespace ridge
