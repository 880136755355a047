// ps_protocol.cpp: the parameter server's layout checks and its small shared messages.
#include "comm/ps_protocol.h"

#include <string>
#include <vector>

namespace kiln::comm::ps {

void check_layout(const Transport& t, const PsOptions& o, const char* what) {
  KILN_CHECK(o.workers >= 1 && o.servers >= 1, what, ": need at least 1 worker and 1 server, got ",
             o.workers, " workers and ", o.servers, " servers");
  KILN_CHECK(o.workers + o.servers <= t.size(), what, ": ", o.workers, " workers + ", o.servers,
             " servers need ", o.workers + o.servers, " ranks, the transport has ", t.size());
  if (!t.device().is_cpu()) {
    throw Error(std::string(what) + ": dedicated parameter servers need a host-memory transport "
                "(local or mpi), not " + t.name() + "; use ps_servers 0 (co-located) or ring",
                ErrorKind::Usage);
  }
  KILN_CHECK(o.staleness >= 0, what, ": staleness must be >= 0, got ", o.staleness);
}

Buffer host_buffer(void* data, int64_t count, ElemType type) {
  Buffer b;
  b.data = data;
  b.count = count;
  b.type = type;
  return b;
}

void send_done(Transport& t, const PsOptions& o, PsKind kind) {
  std::vector<PsHeader> headers(o.servers);
  std::vector<P2POp> ops;
  for (int s = 0; s < o.servers; ++s) {
    headers[s].kind = static_cast<uint32_t>(kind);
    ops.push_back(P2POp::send(&headers[s], sizeof(PsHeader), o.workers + s, kTagPsHeader));
  }
  t.run(ops);
}

}  // namespace kiln::comm::ps
