// Faults: the RIDGE_SOFTNIC_FAULTS parser and the injector every packet a NIC sends goes
// through (drop, duplicate, reorder, delay; staging exhaustion is in Nic::allocChunk).
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/log.h"
#include "transports/softnic/nic.h"
#include "transports/softnic/queues.h"

namespace ridge {
namespace softnic {

using namespace verbs;

namespace {

double parseNumber(const std::string& s, bool* ok) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  *ok = end != s.c_str() && *end == 0 && v >= 0;
  return v;
}

}  // namespace

Status parseFaults(const std::string& text, FaultSpec* out) {
  FaultSpec f;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    const std::string item = text.substr(pos, comma - pos);
    pos = comma + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string::npos)
      return makeError(ridgeInvalidArgument, "RIDGE_SOFTNIC_FAULTS: '%s' is not name=value", item.c_str());
    const std::string key = item.substr(0, eq);
    std::string value = item.substr(eq + 1);
    bool ok = false;
    if (key == "seed") {
      char* end = nullptr;
      f.seed = std::strtoull(value.c_str(), &end, 0);
      ok = end != value.c_str() && *end == 0;
    } else if (key == "delay") {
      const size_t colon = value.find(':');
      if (colon != std::string::npos) {
        std::string t = value.substr(colon + 1);
        value = value.substr(0, colon);
        int64_t scale = 1000;  // microseconds unless a unit says otherwise
        auto strip = [&](const char* unit, int64_t s) {
          size_t n = std::strlen(unit);
          if (t.size() > n && t.compare(t.size() - n, n, unit) == 0) {
            t.resize(t.size() - n);
            scale = s;
            return true;
          }
          return false;
        };
        strip("ns", 1) || strip("us", 1000) || strip("ms", 1000000) || strip("s", 1000000000);
        bool tok = false;
        double d = parseNumber(t, &tok);
        if (!tok)
          return makeError(ridgeInvalidArgument, "RIDGE_SOFTNIC_FAULTS: bad delay time in '%s'",
                           item.c_str());
        f.delayNs = static_cast<int64_t>(d * static_cast<double>(scale));
      }
      f.delay = parseNumber(value, &ok);
    } else {
      double v = parseNumber(value, &ok);
      if (key == "drop")
        f.drop = v;
      else if (key == "dup")
        f.dup = v;
      else if (key == "reorder")
        f.reorder = v;
      else if (key == "staging_exhaust")
        f.stagingExhaust = v;
      else
        return makeError(
            ridgeInvalidArgument,
            "RIDGE_SOFTNIC_FAULTS: unknown fault '%s' (drop, dup, reorder, delay, staging_exhaust, seed)",
            key.c_str());
    }
    if (!ok) return makeError(ridgeInvalidArgument, "RIDGE_SOFTNIC_FAULTS: bad value in '%s'", item.c_str());
    if (f.drop > 0.5 || f.dup > 1 || f.reorder > 1 || f.delay > 1 || f.stagingExhaust > 0.9)
      return makeError(
          ridgeInvalidArgument,
          "RIDGE_SOFTNIC_FAULTS: '%s' is out of range (drop <= 0.5, staging_exhaust <= 0.9, others <= 1)",
          item.c_str());
  }
  *out = f;
  return Status::ok();
}

// Puts one data packet on the wire, through the fault injector.
void Nic::transmit(SoftQp* qp, const FrameHeader& hdr, const char* payload, int64_t now, bool fromHeld) {
  Conn* c = qp->out_;
  if (!c || c->closed) return;
  const FaultSpec& f = opt_.faults;
  int copies = 1;
  if (f.any() && !fromHeld) {
    if (f.drop > 0 && random01() < f.drop) {
      ctr_.injectedDrops.fetch_add(1, std::memory_order_relaxed);
      return;  // still unacknowledged: a resend repairs it
    }
    const bool delay = f.delay > 0 && random01() < f.delay;
    const bool reorder = !delay && f.reorder > 0 && random01() < f.reorder;
    if ((delay || reorder) && qp->heldCount_ < kHeldMax) {
      (delay ? ctr_.injectedDelays : ctr_.injectedReorders).fetch_add(1, std::memory_order_relaxed);
      qp->held_[qp->heldCount_++] = HeldPacket{hdr, payload, delay ? now + f.delayNs : 0};
      return;
    }
    if (f.dup > 0 && random01() < f.dup) {
      ctr_.injectedDups.fetch_add(1, std::memory_order_relaxed);
      copies = 2;
    }
  }
  for (int i = 0; i < copies; ++i) emitData(c, hdr, payload);
  // A packet held back "until after the next one" goes out now.
  if (!fromHeld && qp->heldCount_) releaseHeld(qp, now, true);
}

bool Nic::releaseHeld(SoftQp* qp, int64_t now, bool afterNext) {
  bool did = false;
  for (uint32_t i = 0; i < qp->heldCount_;) {
    HeldPacket& h = qp->held_[i];
    const bool due = h.releaseNs == 0 ? afterNext : h.releaseNs <= now;
    if (!due) {
      ++i;
      continue;
    }
    // A held packet the target already has is harmless: it is discarded as a duplicate,
    // and its staging bytes are only read when its sequence number is still expected,
    // which means it was not acknowledged and its chunk is still ours.
    HeldPacket copy = h;
    h = qp->held_[--qp->heldCount_];
    transmit(qp, copy.hdr, copy.payload, now, true);
    did = true;
  }
  return did;
}

// Puts one read response frame on the inbound connection, through the fault injector: a
// dropped frame is repaired by the requester asking again, a held one goes out after the
// next response frame (or never, which the requester repairs the same way).
void Nic::emitResponse(SoftQp* qp, const FrameHeader& hdr, const char* payload) {
  Conn* c = qp->in_;
  if (!c || c->closed) return;
  const FaultSpec& f = opt_.faults;
  auto append = [&](std::vector<char>* out) {
    const size_t at = out->size();
    out->resize(at + sizeof hdr + hdr.length);
    std::memcpy(out->data() + at, &hdr, sizeof hdr);
    if (hdr.length) std::memcpy(out->data() + at + sizeof hdr, payload, hdr.length);
  };
  int copies = 1;
  if (f.any()) {
    if (f.drop > 0 && random01() < f.drop) {
      ctr_.injectedResponseDrops.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    if ((f.reorder > 0 && random01() < f.reorder) || (f.delay > 0 && random01() < f.delay)) {
      ctr_.injectedResponseReorders.fetch_add(1, std::memory_order_relaxed);
      append(&qp->heldResponses_);
      return;
    }
    if (f.dup > 0 && random01() < f.dup) {
      ctr_.injectedResponseDups.fetch_add(1, std::memory_order_relaxed);
      copies = 2;
    }
  }
  for (int i = 0; i < copies; ++i) append(&c->out);
  ctr_.packetsSent.fetch_add(static_cast<uint64_t>(copies), std::memory_order_relaxed);
  if (!qp->heldResponses_.empty()) {
    c->out.insert(c->out.end(), qp->heldResponses_.begin(), qp->heldResponses_.end());
    qp->heldResponses_.clear();
  }
}

}  // namespace softnic
}  // namespace ridge
