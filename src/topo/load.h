// Loading a machine's topology graph (model.h) from a file.
//
// Formats, told apart by content, not by name:
//  - hwloc XML (`lstopo --of xml`), hwloc 1.x (Socket objects), 2.x and 3.x: <topology>;
//  - NCCL topology XML (NCCL_TOPO_FILE / NCCL_TOPO_DUMP_FILE): <system version="1">;
//  - Ridge's JSON description (topo_json.h), a document that starts with '{'.
// NCCL graph files (<graphs>, NCCL_GRAPH_FILE) describe channels, not a machine, and are
// refused with a message saying so. Every bad input (missing or unreadable file, truncated
// or malformed XML, absurd values, duplicate bus ids) is ridgeInvalidArgument with a message
// naming the file and, for XML, the line. docs/topology.md ("Readers and fuzzing") says how
// each format maps onto the graph.
#pragma once

#include <string>

#include "core/status.h"
#include "topo/model.h"

namespace ridge::topo {

/// Loads any supported file (see above) into `out` (finalized; loadMs set).
Status loadTopologyFile(const std::string& path, Topology* out);
/// Loads an hwloc XML file; anything else is refused.
Status loadHwlocXml(const std::string& path, Topology* out);
/// Loads an NCCL topology XML file; anything else is refused.
Status loadNcclTopologyXml(const std::string& path, Topology* out);

/// The same from text already in memory; `what` names it in messages (a path, or
/// "hwloc export (this machine)"). Used by discovery, tests and the fuzzers.
Status loadTopologyText(const std::string& text, const std::string& what, Topology* out);
Status parseHwlocXmlText(const std::string& text, const std::string& what, Topology* out);
Status parseNcclTopologyXmlText(const std::string& text, const std::string& what, Topology* out);

/// Refuses a path that cannot be a topology description without opening it: a FIFO (reading
/// one would block until a writer comes), a character or block device, a socket, or a directory
/// when `allowDirectory` is false (a capture folder is read with loadCapturedTopology). A path
/// that does not exist passes (the reader reports it). ridgeInvalidArgument naming the path and
/// what it is.
Status checkInputPath(const std::string& path, bool allowDirectory);

/// Largest file the loaders read (bytes). Real descriptions are below 1 MiB; the bound keeps
/// a wrong path (a disk image, /dev/zero) from eating memory.
constexpr size_t kMaxTopologyFileBytes = 64u << 20;

}  // namespace ridge::topo
