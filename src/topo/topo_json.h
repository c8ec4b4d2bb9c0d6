// Ridge's own topology file: the Topology of model.h as JSON, written and read back without
// loss. Used for `ridge-topo --json`, for saving what discovery found on one machine and
// replaying it elsewhere (`--input`), and for hand-written machines in tests.
//
//   {
//     "format": "ridge-topology", "version": 1,
//     "name": "dgx-h100", "source": "preset dgx-h100",
//     "nodes": [
//       {"id": 0, "kind": "machine", "name": "dgx-h100"},
//       {"id": 1, "kind": "package", "parent": 0, "index": 0, "model": "Intel Xeon ..."},
//       {"id": 9, "kind": "gpu", "parent": 8, "busId": "0000:1b:00.0", "pciClass": "0x030200",
//        "vendor": "0x10de", "device": "0x2330", "smVersion": 90, "cudaIndex": 0, ...},
//       {"id": 10, "kind": "nic", ..., "nicDeviceMemory": true,
//        "ports": [{"name": "mlx5_0:1", "netdev": "ibp24s0", "state": "ACTIVE",
//                   "linkLayer": "InfiniBand", "rateGbps": 400}]}
//     ],
//     "links": [
//       {"kind": "pcie", "a": 7, "b": 9, "bandwidthGBs": 48, "latencyNs": 40, "pcieGen": 5,
//        "pcieWidth": 16},
//       {"kind": "nvlink", "a": 9, "b": 80, "bandwidthGBs": 103, "nvlinkCount": 5}
//     ]
//   }
//
// A node's position in "nodes" is its id ("id" is optional and checked when present); links
// name nodes by id. Fields at their default value may be left out (the writer leaves them
// out). Kinds are the names nodeKindName/linkKindName print. PCI ids are hex strings or
// numbers. Unknown fields are errors, so a misspelt field is reported rather than silently
// ignored. What finalize() derives (children, package/NUMA/host bridge of each node, a
// node's link list) is not stored; the switch unit of a bridge is ("pciSwitch"), because a
// reader may set it.
#pragma once

#include <string>

#include "core/status.h"
#include "topo/model.h"

namespace ridge::topo {

/// The format version this build writes and the newest it reads.
inline constexpr int kTopologyJsonVersion = 1;

/// Parses a Ridge topology document into `out` (replacing its contents) and finalizes it.
/// `what` names the source in errors ("file.json:12: node 4: unknown kind 'gpus'").
Status parseTopologyJson(const std::string& text, const std::string& what, Topology* out);

/// Serializes `t` (finalized or not) as a Ridge topology document, 2-space indented, ending
/// with a newline. parseTopologyJson(topologyToJson(t)) reproduces every node and link field.
std::string topologyToJson(const Topology& t);

}  // namespace ridge::topo
