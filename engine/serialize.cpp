// serialize.cpp: writing and validating Kiln checkpoint files (layout in serialize.h).
#include "engine/serialize.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "engine/error.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "serialize.cpp writes native integers: the checkpoint format is little-endian"
#endif

namespace kiln {

namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'C', 'K', 'P', 'T'};
constexpr size_t kHeaderBytes = 40;
constexpr uint64_t kAlign = 64;
// Sanity limits: anything above is a corrupt file, not a real checkpoint.
constexpr uint32_t kMaxEntries = 1u << 24;
constexpr uint32_t kMaxNameBytes = 1u << 16;
constexpr uint32_t kMaxValueBytes = 1u << 24;
constexpr uint8_t kMaxDims = 16;

// ---- Writing --------------------------------------------------------------------------------

void put_bytes(std::vector<char>& out, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  out.insert(out.end(), c, c + n);
}
template <typename T>
void put(std::vector<char>& out, T v) { put_bytes(out, &v, sizeof(T)); }
void put_string(std::vector<char>& out, const std::string& s) {
  put<uint32_t>(out, static_cast<uint32_t>(s.size()));
  put_bytes(out, s.data(), s.size());
}

[[noreturn]] void throw_io(const std::string& what, const std::string& path) {
  throw Error(detail::str("checkpoint '", path, "': ", what, " failed: ", std::strerror(errno),
                          " (check the directory exists, is writable and has free space; a "
                          "previous checkpoint at that path is unchanged)"));
}

// Writes all n bytes or throws. A short write is retried for the rest: on a full disk (or past
// RLIMIT_FSIZE, with SIGXFSZ ignored) the retry then fails with ENOSPC (EFBIG), which is the
// error reported. A write that returns 0 without an error is reported as the short write it is.
void write_all(int fd, const void* p, size_t n, const std::string& tmp,
               const std::string& path) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = ::write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) throw_io("writing " + tmp, path);
    if (w == 0) {
      throw Error(detail::str("checkpoint '", path, "': writing ", tmp, ": short write, 0 of ",
                              n, " bytes written (check the disk has free space)"));
    }
    c += w;
    n -= static_cast<size_t>(w);
  }
}

// Test hook: KILN_CHECKPOINT_TEST_STALL_MS=<ms> sleeps that long in the middle of writing the
// ".tmp" file (after its header and table, before the payloads), so a crash test can kill the
// process while a checkpoint is half written (tools/kill_resume.sh). Unset: no effect.
void test_stall_mid_write() {
  const char* ms = std::getenv("KILN_CHECKPOINT_TEST_STALL_MS");
  if (ms == nullptr || *ms == '\0') return;
  const long v = std::strtol(ms, nullptr, 10);
  if (v > 0) ::usleep(static_cast<useconds_t>(v) * 1000);
}

std::string parent_dir(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// ---- Reading --------------------------------------------------------------------------------

// Reads fields from the table with bounds checks; every failure names the file.
struct Cursor {
  const std::vector<char>& buf;
  size_t pos;
  const std::string& path;
  void need(size_t n, const char* what) {
    KILN_CHECK_INPUT(n <= buf.size() - pos, "checkpoint '", path, "' is corrupt: the table ends inside ",
                     what);
  }
  template <typename T>
  T get(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, buf.data() + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
  std::string get_string(uint32_t max_len, const char* what) {
    uint32_t n = get<uint32_t>(what);
    KILN_CHECK_INPUT(n <= max_len, "checkpoint '", path, "' is corrupt: ", what, " has length ", n,
                     " (limit ", max_len, ")");
    need(n, what);
    std::string s(buf.data() + pos, n);
    pos += n;
    return s;
  }
};

void read_at(int fd, void* p, size_t n, uint64_t offset, const std::string& path) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = ::pread(fd, c, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    KILN_CHECK_INPUT(r > 0, "checkpoint '", path, "': read failed at byte ", offset, ": ",
                     r == 0 ? "unexpected end of file (truncated)" : std::strerror(errno));
    c += r;
    offset += static_cast<uint64_t>(r);
    n -= static_cast<size_t>(r);
  }
}

// The largest dtype code of each format version, and the version a dtype needs.
uint8_t last_dtype_of_version(uint32_t version) {
  return version >= 2 ? kLastDType : static_cast<uint8_t>(DType::U8);
}
uint32_t version_for(DType t) { return is_low_precision(t) ? 2 : 1; }

// Closes a file descriptor on scope exit.
struct Fd {
  int fd;
  ~Fd() { if (fd >= 0) ::close(fd); }
};

}  // namespace

uint32_t crc32(const void* data, size_t n, uint32_t crc) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  const unsigned char* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

void write_checkpoint(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& meta) {
  // Host copies of every tensor (a no-op for CPU tensors).
  std::vector<std::pair<std::string, Tensor>> host;
  for (const auto& [name, t] : tensors) {
    KILN_CHECK(!name.empty() && name.size() <= kMaxNameBytes, "write_checkpoint: bad record name '",
               name, "'");
    KILN_CHECK(t.defined(), "write_checkpoint: tensor '", name, "' is undefined");
    KILN_CHECK(t.dim() <= kMaxDims, "write_checkpoint: tensor '", name, "' has ", t.dim(),
               " dims (limit ", int(kMaxDims), ")");
    // In logical order: a channels-last tensor (a weight after Module::to(MemoryFormat)) is
    // saved as its contiguous copy, so that files do not depend on the format, and
    // load_state_dict reorders into whatever format the model it loads into has.
    Tensor h = t.device().is_cpu() ? t : t.detach().to(Device());
    host.emplace_back(name, h.is_channels_last() ? h.detach().contiguous() : h);
  }
  for (const auto& [k, v] : meta)
    KILN_CHECK(!k.empty() && k.size() <= kMaxNameBytes && v.size() <= kMaxValueBytes,
               "write_checkpoint: bad meta entry '", k, "'");

  // Table, with payload offsets laid out after it (each aligned to 64 bytes).
  std::vector<char> table;
  for (const auto& [k, v] : meta) {
    put_string(table, k);
    put_string(table, v);
  }
  size_t record_table_bytes = 0;
  for (const auto& [name, t] : host)
    record_table_bytes += 4 + name.size() + 4 + 8 * t.shape().size() + 8 + 8 + 4;
  uint64_t offset = kHeaderBytes + table.size() + record_table_bytes;
  std::vector<uint64_t> offsets;
  for (const auto& [name, t] : host) {
    offset = (offset + kAlign - 1) / kAlign * kAlign;
    offsets.push_back(offset);
    const uint64_t len = t.nbytes();
    put_string(table, name);
    put<uint8_t>(table, static_cast<uint8_t>(t.dtype()));
    put<uint8_t>(table, static_cast<uint8_t>(t.dim()));
    put<uint16_t>(table, 0);
    for (int64_t d : t.shape()) put<int64_t>(table, d);
    put<uint64_t>(table, offset);
    put<uint64_t>(table, len);
    put<uint32_t>(table, crc32(t.raw_data(), len));
    offset += len;
  }

  // The oldest version that can hold every dtype written (see serialize.h).
  uint32_t version = kCheckpointMinVersion;
  for (const auto& [name, t] : host) version = std::max(version, version_for(t.dtype()));

  std::vector<char> header;
  put_bytes(header, kMagic, 8);
  put<uint32_t>(header, version);
  put<uint32_t>(header, static_cast<uint32_t>(meta.size()));
  put<uint32_t>(header, static_cast<uint32_t>(host.size()));
  put<uint32_t>(header, crc32(table.data(), table.size()));
  put<uint64_t>(header, table.size());
  put<uint32_t>(header, 0);
  put<uint32_t>(header, crc32(header.data(), header.size()));

  const std::string tmp = path + ".tmp";
  Fd f{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
  if (f.fd < 0) throw_io("creating " + tmp, path);
  try {
    write_all(f.fd, header.data(), header.size(), tmp, path);
    write_all(f.fd, table.data(), table.size(), tmp, path);
    test_stall_mid_write();
    uint64_t at = kHeaderBytes + table.size();
    static const char zeros[kAlign] = {};
    for (size_t r = 0; r < host.size(); ++r) {
      write_all(f.fd, zeros, offsets[r] - at, tmp, path);
      write_all(f.fd, host[r].second.raw_data(), host[r].second.nbytes(), tmp, path);
      at = offsets[r] + host[r].second.nbytes();
    }
    if (::fsync(f.fd) != 0) throw_io("fsync of " + tmp, path);
    int fd = f.fd;
    f.fd = -1;
    if (::close(fd) != 0) throw_io("close of " + tmp, path);
    if (::rename(tmp.c_str(), path.c_str()) != 0) throw_io("rename of " + tmp, path);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  // Make the rename itself durable. The new file is in place already; a directory that cannot
  // be synced is still reported (the checkpoint may not survive a power loss). EINVAL: this
  // file system does not sync directories, nothing to report.
  Fd dir{::open(parent_dir(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (dir.fd < 0) throw_io("opening the directory " + parent_dir(path) + " to fsync it", path);
  if (::fsync(dir.fd) != 0 && errno != EINVAL) throw_io("fsync of the directory", path);
}

Checkpoint read_checkpoint(const std::string& path) {
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  KILN_CHECK_INPUT(f.fd >= 0, "cannot open checkpoint '", path, "': ", std::strerror(errno));
  struct stat st;
  KILN_CHECK_INPUT(::fstat(f.fd, &st) == 0 && S_ISREG(st.st_mode), "checkpoint '", path,
                   "' is not a regular file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  KILN_CHECK_INPUT(size >= kHeaderBytes, "checkpoint '", path, "' is too small (", size,
                   " bytes) to be a Kiln checkpoint: truncated or not a checkpoint");

  std::vector<char> header(kHeaderBytes);
  read_at(f.fd, header.data(), kHeaderBytes, 0, path);
  KILN_CHECK_INPUT(std::memcmp(header.data(), kMagic, 8) == 0, "'", path,
                   "' is not a Kiln checkpoint (bad magic; expected \"KILNCKPT\")");
  Cursor hc{header, 8, path};
  const uint32_t version = hc.get<uint32_t>("header");
  KILN_CHECK_INPUT(version >= kCheckpointMinVersion && version <= kCheckpointVersion,
                   "checkpoint '", path, "' has format version ", version,
                   " but this build reads versions ", kCheckpointMinVersion, " to ",
                   kCheckpointVersion, ": re-save it with a matching Kiln");
  const uint32_t num_meta = hc.get<uint32_t>("header");
  const uint32_t num_records = hc.get<uint32_t>("header");
  const uint32_t table_crc = hc.get<uint32_t>("header");
  const uint64_t table_bytes = hc.get<uint64_t>("header");
  const uint32_t reserved = hc.get<uint32_t>("header");
  const uint32_t header_crc = hc.get<uint32_t>("header");
  KILN_CHECK_INPUT(crc32(header.data(), kHeaderBytes - 4) == header_crc, "checkpoint '", path,
                   "' is corrupt: header CRC mismatch");
  KILN_CHECK_INPUT(reserved == 0, "checkpoint '", path, "' is corrupt: the reserved header "
                   "field is ", reserved, ", not 0");
  KILN_CHECK_INPUT(num_meta <= kMaxEntries && num_records <= kMaxEntries, "checkpoint '", path,
                   "' is corrupt: absurd entry counts (", num_meta, " meta, ", num_records,
                   " records)");
  KILN_CHECK_INPUT(table_bytes <= size - kHeaderBytes, "checkpoint '", path,
                   "' is truncated: its table needs ", table_bytes, " bytes but the file has ",
                   size, " bytes in all");

  std::vector<char> table(table_bytes);
  read_at(f.fd, table.data(), table.size(), kHeaderBytes, path);
  KILN_CHECK_INPUT(crc32(table.data(), table.size()) == table_crc, "checkpoint '", path,
                   "' is corrupt: table CRC mismatch");

  Checkpoint ck;
  Cursor c{table, 0, path};
  for (uint32_t i = 0; i < num_meta; ++i) {
    std::string k = c.get_string(kMaxNameBytes, "a meta key");
    std::string v = c.get_string(kMaxValueBytes, "a meta value");
    KILN_CHECK_INPUT(!k.empty(), "checkpoint '", path, "' is corrupt: meta entry ", i,
                     " has an empty key");
    KILN_CHECK_INPUT(ck.meta.emplace(k, v).second, "checkpoint '", path,
                     "' is corrupt: duplicate meta key '", k, "'");
  }
  // Payloads lie one after the other in record order, each at the next multiple of 64 (the
  // writer's layout): anything else (overlapping payloads, gaps, bytes after the last one) is
  // damage or a file that was appended to, and is refused.
  const uint64_t payload_start = kHeaderBytes + table_bytes;
  uint64_t payload_end = payload_start;  // end of the previous record's payload
  for (uint32_t r = 0; r < num_records; ++r) {
    const std::string name = c.get_string(kMaxNameBytes, "a record name");
    KILN_CHECK_INPUT(!name.empty(), "checkpoint '", path, "' is corrupt: record ", r,
                     " has an empty name");
    const std::string where = detail::str("checkpoint '", path, "' record '", name, "'");
    const uint8_t dt = c.get<uint8_t>("a record");
    const uint8_t ndim = c.get<uint8_t>("a record");
    const uint16_t record_reserved = c.get<uint16_t>("a record");
    KILN_CHECK_INPUT(record_reserved == 0, where, " is corrupt: its reserved field is ",
                     record_reserved, ", not 0");
    KILN_CHECK_INPUT(dt <= last_dtype_of_version(version), where, " has dtype code ", int(dt),
                     ", which format version ", version, " does not define (it knows 0..",
                     int(last_dtype_of_version(version)),
                     "): the file is corrupt, or was written by a newer Kiln; load it with that "
                     "Kiln, or re-save its tensors converted to f32 there");
    KILN_CHECK_INPUT(ndim <= kMaxDims, where, " is corrupt: ", int(ndim), " dims");
    const DType dtype = static_cast<DType>(dt);
    Shape shape(ndim);
    uint64_t numel = 1;
    for (auto& d : shape) {
      d = c.get<int64_t>("a record shape");
      KILN_CHECK_INPUT(d >= 0 && static_cast<uint64_t>(d) <= size, where,
                       " is corrupt: absurd dimension ", d);
      numel *= static_cast<uint64_t>(d);  // each factor <= file size: check before it can wrap
      KILN_CHECK_INPUT(numel <= size, where, " is corrupt: shape ", shape_str(shape),
                       " is larger than the whole file");
    }
    const uint64_t offset = c.get<uint64_t>("a record");
    const uint64_t len = c.get<uint64_t>("a record");
    const uint32_t crc = c.get<uint32_t>("a record");
    KILN_CHECK_INPUT(len == numel * dtype_size(dtype), where, " is corrupt: ", len,
                     " payload bytes for ", dtype_name(dtype), " ", shape_str(shape));
    KILN_CHECK_INPUT(offset >= payload_start && offset <= size && len <= size - offset, where,
                     " extends past the end of the file (bytes ", offset, "..", offset + len,
                     " of ", size, "): the file is truncated");
    const uint64_t expected_offset = (payload_end + kAlign - 1) / kAlign * kAlign;
    KILN_CHECK_INPUT(offset == expected_offset, where, " is corrupt: its payload starts at byte ",
                     offset, ", but the previous one ends at byte ", payload_end,
                     " (expected the next multiple of ", kAlign, ": ", expected_offset, ")");
    payload_end = offset + len;
    KILN_CHECK_INPUT(!ck.tensors.count(name), "checkpoint '", path,
                     "' is corrupt: duplicate record '", name, "'");
    Tensor t = Tensor::empty(shape, dtype, Device());
    if (len > 0) read_at(f.fd, t.raw_data(), len, offset, path);
    const uint32_t got = crc32(t.raw_data(), len);
    KILN_CHECK_INPUT(got == crc, where, " is corrupt: CRC32 mismatch (stored ", crc, ", computed ",
                     got, "); the file was damaged after it was written");
    ck.tensors.emplace(name, t);
  }
  KILN_CHECK_INPUT(c.pos == table.size(), "checkpoint '", path, "' is corrupt: ",
                   table.size() - c.pos, " unexpected bytes after the table");
  KILN_CHECK_INPUT(payload_end == size, "checkpoint '", path, "' has ", size - payload_end,
                   " trailing bytes after its last record (it ends at byte ", payload_end,
                   " of ", size, "): the file was appended to or is damaged; restore it from a "
                   "copy or re-save it");
  return ck;
}

}  // namespace kiln
