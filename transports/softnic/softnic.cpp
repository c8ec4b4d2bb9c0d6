// The software NIC's public face: the verbs provider and device objects, the options from
// the settings, and the functions of softnic.h. The NIC itself is in nic.h; see softnic.h for
// the model and docs/transports.md for the wire format.
#include "transports/softnic/softnic.h"

#include <algorithm>

#include "core/log.h"
#include "core/settings.h"
#include "transports/softnic/memory.h"
#include "transports/softnic/nic.h"

namespace ridge {
namespace softnic {

using namespace verbs;

namespace {

class SoftDevice final : public Device {
 public:
  explicit SoftDevice(std::shared_ptr<Nic> nic) : nic_(std::move(nic)) {}
  const DeviceAttributes& attributes() const override { return nic_->attributes(); }
  Status allocPd(std::unique_ptr<ProtectionDomain>* out) override {
    *out = newProtectionDomain(nic_);
    return Status::ok();
  }
  Counters counters() const { return nic_->counters(); }
  void kick() { nic_->kick(); }
  void waitActivity(int64_t maxWaitNs, bool (*stillIdle)(void*), void* arg) {
    nic_->waitActivity(maxWaitNs, stillIdle, arg);
  }

 private:
  std::shared_ptr<Nic> nic_;
};

class SoftProvider final : public Provider {
 public:
  const char* name() const override { return "softnic"; }
  Status listDevices(std::vector<DeviceAttributes>* out) override {
    DeviceAttributes a;
    Options o = Options::fromSettings();
    a.name = "softnic";
    a.provider = "softnic";
    a.maxDeviceMemoryBytes = o.stagingBytes / 2;
    a.portCount = 1;
    a.portActive = true;
    a.mtuBytes = static_cast<uint32_t>(o.mtu);
    out->assign(1, a);
    return Status::ok();
  }
  Status open(int index, std::unique_ptr<Device>* out) override {
    if (index != 0) return makeError(ridgeInvalidArgument, "softnic: no device %d (only 0)", index);
    return openDevice(Options::fromSettings(), out);
  }
};

}  // namespace

Options Options::fromSettings() {
  Options o;
  int64_t staging = settingSize(Setting::SOFTNIC_STAGING_BYTES);
  o.stagingBytes = static_cast<size_t>(std::clamp<int64_t>(staging, 4096, 1ll << 30));
  int64_t mtu = settingSize(Setting::SOFTNIC_MTU);
  o.mtu = static_cast<size_t>(std::clamp<int64_t>(mtu, 256, 1 << 20));
  o.rtoNs = std::max<int64_t>(settingInt(Setting::SOFTNIC_RTO_US), 50) * 1000;
  o.forceTcpPayload = settingString(Setting::SOFTNIC_WIRE) == "tcp";
  FaultSpec f;
  if (parseFaults(settingString(Setting::SOFTNIC_FAULTS), &f).isOk()) o.faults = f;
  return o;
}

Status openDevice(const Options& options, std::unique_ptr<Device>* out) {
  auto nic = std::make_shared<Nic>(options);
  RIDGE_TRY(nic->start());
  *out = std::make_unique<SoftDevice>(std::move(nic));
  return Status::ok();
}

Counters deviceCounters(const Device* device) {
  auto* d = dynamic_cast<const SoftDevice*>(device);
  return d ? d->counters() : Counters{};
}

void notifyDoorbell(Device* device) {
  if (auto* d = dynamic_cast<SoftDevice*>(device)) d->kick();
}

bool waitForNicActivity(Device* device, int64_t maxWaitNs, bool (*stillIdle)(void*), void* arg) {
  auto* d = dynamic_cast<SoftDevice*>(device);
  if (!d) return false;
  d->waitActivity(maxWaitNs, stillIdle, arg);
  return true;
}

}  // namespace softnic

namespace verbs {
Status createSoftnicProvider(std::unique_ptr<Provider>* out) {
  *out = std::make_unique<softnic::SoftProvider>();
  return Status::ok();
}
}  // namespace verbs

}  // namespace ridge
