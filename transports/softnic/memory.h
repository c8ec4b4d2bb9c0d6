// Memory: the protection domain, which registers memory regions (host memory and dma-bufs)
// and device memory carved out of the NIC's staging, and creates the CQs and QPs bound to it.
#pragma once

#include <memory>

#include "transports/verbs/verbs.h"

namespace ridge {
namespace softnic {

class Nic;
std::unique_ptr<verbs::ProtectionDomain> newProtectionDomain(std::shared_ptr<Nic> nic);

}  // namespace softnic
}  // namespace ridge
