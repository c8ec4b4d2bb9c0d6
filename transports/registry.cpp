#include "core/log.h"
#include "core/settings.h"
#include "transports/transport.h"

namespace ridge {

// Built-in tables, defined in each transport's folder.
extern const TransportTable kShmTransportTable;
extern const TransportTable kSocketTransportTable;
extern const TransportTable kNetTransportTable;
namespace gdr {
extern const TransportTable kGdrTransportTable;  // before the network transports: RIDGE_GDR_MODE
}

static std::vector<const TransportTable*>& tables() {
  static std::vector<const TransportTable*> list = [] {
    std::vector<const TransportTable*> builtin;
    builtin.push_back(&kShmTransportTable);
    builtin.push_back(&gdr::kGdrTransportTable);
    builtin.push_back(&kSocketTransportTable);
    builtin.push_back(&kNetTransportTable);
    return builtin;
  }();
  return list;
}

bool registerTransport(const TransportTable* table) {
  if (!table || table->size != sizeof(TransportTable) || table->version != kTransportTableVersion) {
    RIDGE_WARN("transport table %s refused: size %u version %u, expected size %zu version %u",
               table && table->name ? table->name : "(null)", table ? table->size : 0,
               table ? table->version : 0, sizeof(TransportTable), kTransportTableVersion);
    return false;
  }
  tables().push_back(table);
  return true;
}

const std::vector<const TransportTable*>& registeredTransports() {
  return tables();
}

bool connectedBefore(const TransportTable* table, const TransportSetup& setup, int a, int b) {
  for (const TransportTable* t : tables()) {
    if (t == table) return false;
    if (t->canConnect(setup, a, b)) return true;
  }
  return false;
}

int64_t shmSlotBytes(bool warn) {
  int64_t bytes = settingSize(Setting::SHM_SLOT_BYTES);
  if (bytes < 4096 || bytes > (1ll << 30)) {
    if (warn)
      RIDGE_WARN("RIDGE_SHM_SLOT_BYTES=%lld is outside 4K..1G; using 256K", static_cast<long long>(bytes));
    bytes = 256 << 10;
  }
  return (bytes + 4095) / 4096 * 4096;
}

int64_t slotBytesBesideShm(const TransportTable* self, const TransportSetup& setup, int64_t own) {
  for (int a = 0; a < setup.nranks; ++a)
    for (int b = a + 1; b < setup.nranks; ++b)
      if (connectedBefore(self, setup, a, b)) return shmSlotBytes(false);
  return own;
}

}  // namespace ridge
