// transport.cpp: what every transport shares: element types, byte counting, timeouts.
#include "comm/transport.h"

#include <cstdlib>
#include <sstream>

namespace kiln::comm {

size_t elem_size(ElemType t) {
  switch (t) {
    case ElemType::F32: return 4;
    case ElemType::F64: return 8;
    case ElemType::F16: return 2;
    case ElemType::BF16: return 2;
  }
  return 0;
}

const char* elem_name(ElemType t) {
  switch (t) {
    case ElemType::F32: return "f32";
    case ElemType::F64: return "f64";
    case ElemType::F16: return "f16";
    case ElemType::BF16: return "bf16";
  }
  return "?";
}

const char* reduce_op_name(ReduceOp op) { return op == ReduceOp::Sum ? "sum" : "average"; }

Buffer Buffer::slice(int64_t offset, int64_t n) const {
  KILN_CHECK(offset >= 0 && n >= 0 && offset + n <= count, "Buffer::slice: [", offset, ", ",
             offset + n, ") is outside a buffer of ", count, " elements");
  Buffer b = *this;
  b.data = static_cast<char*>(data) + static_cast<size_t>(offset) * elem_size(type);
  b.count = n;
  return b;
}

Request::~Request() = default;

Transport::Transport() : timeout_seconds_(default_timeout_seconds()) {}
Transport::~Transport() = default;

void Transport::run(const std::vector<P2POp>& ops) { start(ops)->wait(); }

void Transport::native_allreduce(const Buffer&, ReduceOp) {
  throw Error(std::string("allreduce 'native': the ") + name() + " transport has no library "
              "allreduce (only mpi and nccl do); use ring, hd or ps", ErrorKind::Usage);
}

double default_timeout_seconds() {
  const char* v = std::getenv("KILN_COMM_TIMEOUT_S");
  if (v == nullptr || *v == '\0') return 300.0;
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  if (end == v || *end != '\0' || !(s > 0)) {
    throw Error(std::string("KILN_COMM_TIMEOUT_S='") + v + "': expected a positive number of "
                "seconds", ErrorKind::Usage);
  }
  return s;
}

Error timeout_error(const Transport& t, const std::string& what, double waited_seconds) {
  std::ostringstream os;
  os << "rank " << t.rank() << "/" << t.size() << " (" << t.name() << "): " << what
     << " did not complete within " << waited_seconds << " s: a peer has died or is stuck. "
     << "Check the other ranks' output; raise KILN_COMM_TIMEOUT_S if the peer is only slow";
  return Error(os.str(), ErrorKind::Runtime);
}

Error peer_died_error(const Transport& t, const std::string& dead,
                      const std::string& waiting_for) {
  std::ostringstream os;
  os << "rank " << t.rank() << "/" << t.size() << " (" << t.name() << "): " << dead
     << "; this rank stopped waiting for " << waiting_for << ". The job cannot go on "
     << "without it: restart the job (from its last checkpoint)";
  return Error(os.str(), ErrorKind::Runtime);
}

}  // namespace kiln::comm
