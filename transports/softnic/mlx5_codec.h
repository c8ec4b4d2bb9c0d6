// What libmlx5 does inside the provider, for softnic: the translations between the verbs
// subset's opcodes and statuses and the mlx5 ones the queues carry. The decoders that use them
// (Nic::takeWqe for WQEs, SoftCq::poll for CQEs) are in mlx5_codec.cpp; the encoders
// (SoftQp::postSend, postRecv) in queues.cpp.
#pragma once

#include <cstdint>

#include "transports/verbs/verbs.h"

namespace ridge {
namespace softnic {

using namespace verbs;

uint8_t mlx5OpcodeOf(uint8_t wqeOpcode);
uint8_t verbsOpcodeOf(uint8_t mlx5Opcode);
uint8_t syndromeOf(uint8_t status);
uint8_t statusOfSyndrome(uint8_t syndrome);

}  // namespace softnic
}  // namespace ridge
