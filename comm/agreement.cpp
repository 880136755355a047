// agreement.cpp: see agreement.h.
#include "comm/agreement.h"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/algo_util.h"
#include "engine/autograd.h"
#include "engine/cuda/sync_debug.h"
#include "engine/error.h"

namespace kiln::comm {

namespace {

constexpr char kMagic[] = "kiln-settings-1";  // the encoding's first bytes (and its version)

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

bool get_u32(const std::string& in, size_t& pos, uint32_t& v) {
  if (in.size() - pos < 4) return false;
  v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(in[pos + i])) << (8 * i);
  pos += 4;
  return true;
}

bool get_text(const std::string& in, size_t& pos, std::string& s) {
  uint32_t n = 0;
  if (!get_u32(in, pos, n) || in.size() - pos < n) return false;
  s = in.substr(pos, n);
  pos += n;
  return true;
}

// Bytes to and from the transport's device: host memory for local and mpi, the rank's GPU for
// nccl (its buffers must live there). A U8 tensor either way; on a GPU the copies wait for the
// device, once per message of a check that runs once per run.
Tensor to_wire(const Transport& t, const std::string& bytes) {
  std::vector<uint8_t> v(bytes.begin(), bytes.end());
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, t.device());
}

std::string from_wire(const Tensor& wire) {
  const std::vector<uint8_t> v = wire.to_vector<uint8_t>();
  return std::string(v.begin(), v.end());
}

// A length as 8 little-endian bytes: the fixed-size first message of every exchange.
std::string length_bytes(uint64_t n) {
  std::string s;
  put_u32(s, static_cast<uint32_t>(n & 0xffffffffu));
  put_u32(s, static_cast<uint32_t>(n >> 32));
  return s;
}

uint64_t length_of(const std::string& s) {
  size_t pos = 0;
  uint32_t lo = 0, hi = 0;
  get_u32(s, pos, lo);
  get_u32(s, pos, hi);
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

// Sends `bytes` to `peer`: its length, then (when not empty) the bytes.
void send_text(Transport& t, const std::string& bytes, int peer) {
  const Tensor len = to_wire(t, length_bytes(bytes.size()));
  t.run({P2POp::send(len.raw_data(), len.nbytes(), peer, kTagAgreementLength)});
  if (bytes.empty()) return;
  const Tensor payload = to_wire(t, bytes);
  t.run({P2POp::send(payload.raw_data(), payload.nbytes(), peer, kTagAgreementPayload)});
}

// Receives what send_text sent from `peer`. A length past `limit` is refused before anything is
// allocated for it (a peer that is not running this code sends anything).
std::string recv_text(Transport& t, int peer, uint64_t limit) {
  Tensor len = Tensor::empty({8}, DType::U8, t.device());
  t.run({P2POp::recv(len.raw_data(), len.nbytes(), peer, kTagAgreementLength)});
  const uint64_t n = length_of(from_wire(len));
  if (n == 0) return "";
  if (n > limit) {
    throw Error(detail::str("rank ", peer, " announced ", n, " bytes of settings, more than the ",
                            limit, " a Kiln rank sends: is every rank running the same Kiln "
                            "program?"),
                ErrorKind::Runtime);
  }
  Tensor payload = Tensor::empty({static_cast<int64_t>(n)}, DType::U8, t.device());
  t.run({P2POp::recv(payload.raw_data(), payload.nbytes(), peer, kTagAgreementPayload)});
  return from_wire(payload);
}

// "rank 3", "ranks 0-2, 5".
std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i > 0) s += ", ";
    s += std::to_string(ranks[i]);
    if (j > i) s += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return s;
}

std::string shown(const std::optional<std::string>& v) {
  if (!v) return "(not set)";
  if (v->empty()) return "\"\"";
  return *v;
}

// Rank 0's verdict over every member's list: "" when all equal rank 0's, else the message.
std::string verdict(const std::vector<std::vector<Setting>>& lists,
                    const std::vector<bool>& readable) {
  std::string unreadable;
  for (size_t r = 0; r < lists.size(); ++r) {
    if (!readable[r]) unreadable += (unreadable.empty() ? "" : ", ") + std::to_string(r);
  }
  if (!unreadable.empty()) {
    return "rank(s) " + unreadable + " sent settings this program cannot read: every rank must "
           "run the same Kiln program, built from the same sources";
  }
  // Every name in the order rank 0 lists them, then the names only other ranks have.
  std::vector<std::string> names;
  for (const std::vector<Setting>& list : lists) {
    for (const Setting& s : list) {
      bool known = false;
      for (const std::string& n : names) known = known || n == s.name;
      if (!known) names.push_back(s.name);
    }
  }
  std::string differences;
  for (const std::string& name : names) {
    // Each distinct value with the ranks that hold it, in the order of their first rank.
    std::vector<std::pair<std::optional<std::string>, std::vector<int>>> groups;
    for (size_t r = 0; r < lists.size(); ++r) {
      std::optional<std::string> value;
      for (const Setting& s : lists[r]) {
        if (s.name == name) {
          value = s.value;
          break;
        }
      }
      bool placed = false;
      for (auto& g : groups) {
        if (g.first == value) {
          g.second.push_back(static_cast<int>(r));
          placed = true;
          break;
        }
      }
      if (!placed) groups.push_back({value, {static_cast<int>(r)}});
    }
    if (groups.size() == 1) continue;
    differences += differences.empty() ? "ranks disagree on " : "; on ";
    differences += name + ":";
    for (size_t g = 0; g < groups.size(); ++g) {
      differences += (g > 0 ? ", " : " ") + rank_list(groups[g].second) + " " + shown(groups[g].first);
    }
  }
  if (!differences.empty()) return differences + "; every rank must be started with the same flags";
  // The same values under the same names, but not in the same order: the programs differ.
  for (size_t r = 1; r < lists.size(); ++r) {
    bool same = lists[r].size() == lists[0].size();
    for (size_t i = 0; same && i < lists[r].size(); ++i) {
      same = lists[r][i].name == lists[0][i].name && lists[r][i].value == lists[0][i].value;
    }
    if (!same) {
      return "rank " + std::to_string(r) + " lists its settings in another order than rank 0: "
             "every rank must run the same Kiln program, built from the same sources";
    }
  }
  return "";
}

}  // namespace

std::string encode_settings(const std::vector<Setting>& settings) {
  std::string out(kMagic, sizeof kMagic - 1);
  put_u32(out, static_cast<uint32_t>(settings.size()));
  for (const Setting& s : settings) {
    put_u32(out, static_cast<uint32_t>(s.name.size()));
    out += s.name;
    put_u32(out, static_cast<uint32_t>(s.value.size()));
    out += s.value;
  }
  return out;
}

bool decode_settings(const std::string& bytes, std::vector<Setting>& out) {
  out.clear();
  const size_t magic = sizeof kMagic - 1;
  if (bytes.size() < magic || bytes.compare(0, magic, kMagic) != 0) return false;
  size_t pos = magic;
  uint32_t count = 0;
  if (!get_u32(bytes, pos, count)) return false;
  for (uint32_t i = 0; i < count; ++i) {
    Setting s;
    if (!get_text(bytes, pos, s.name) || !get_text(bytes, pos, s.value)) return false;
    out.push_back(std::move(s));
  }
  return pos == bytes.size();
}

void check_ranks_agree(Transport& t, const std::vector<Setting>& settings, int members,
                       const std::function<void(const std::string&)>& on_refusal) {
  const int n = members < 0 ? t.size() : members;
  KILN_CHECK(n >= 1 && n <= t.size(), "check_ranks_agree: members ", n, " of ", t.size(),
             " ranks");
  const int rank = t.rank();
  if (rank >= n || n == 1) return;
  cuda::AllowSync allow("check_ranks_agree: the settings are staged through the GPU once");
  // Names and values are flags' text: a megabyte is far past any real list, and keeps a
  // stranger's length from allocating gigabytes.
  constexpr uint64_t kLimit = uint64_t{1} << 20;
  const std::string mine = encode_settings(settings);
  KILN_CHECK(mine.size() <= kLimit, "check_ranks_agree: ", mine.size(), " bytes of settings");
  std::string result;
  if (rank == 0) {
    std::vector<std::vector<Setting>> lists(n);
    std::vector<bool> readable(n, true);
    lists[0] = settings;
    // Lengths and lists from each rank in turn: receives that name their peer (NCCL has no
    // any-source receive), each sized by the length that came before it.
    for (int r = 1; r < n; ++r) {
      readable[r] = decode_settings(recv_text(t, r, kLimit), lists[r]);
    }
    result = verdict(lists, readable);
    if (!result.empty() && on_refusal) on_refusal(result);
    for (int r = 1; r < n; ++r) send_text(t, result, r);
  } else {
    send_text(t, mine, 0);
    result = recv_text(t, 0, kLimit);
  }
  if (!result.empty()) throw Error(result, ErrorKind::Usage);
}

bool any_rank(Communicator& comm, bool flag) {
  NoGradGuard no_grad;
  // A sum of 0s and 1s: exact in f32 for any realistic number of ranks (up to 2^24).
  Tensor t = Tensor::full({1}, flag ? 1.0 : 0.0, DType::F32, comm.transport().device());
  comm.allreduce(t, ReduceOp::Sum, Algorithm::Ring);
  return t.item() > 0.5;
}

}  // namespace kiln::comm
