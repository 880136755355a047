// jpeg_check.cpp: walks a JPEG's segments in the order stb_image reads them and refuses tables
// that stb_image 2.27 would mishandle (jpeg_check.h says which and why).
//
// The walk reads the file as stb does: markers are 0xFF then a code (0xFF fill bytes skipped), a
// segment's 16-bit length counts itself, the tables of a DHT or DQT segment are read while its
// remaining length is above 0 (even past the segment's end: stb then fails the file), bytes
// past the end of the file read as 0, and the entropy-coded data after a scan header is walked
// byte by byte up to the next marker. Where the walk and stb could part (a marker stb does not
// know, garbage between segments, a second frame header), stb fails the file at that point, so
// it never decodes a scan the walk has not checked.
#include "data/jpeg_check.h"

#include <cstdint>
#include <vector>

#include "engine/error.h"

namespace kiln::detail {

namespace {

// Table classes of a DHT segment, and the marker codes the walk acts on.
constexpr unsigned kDc = 0, kAc = 1;
constexpr unsigned kSof0 = 0xC0, kSof1 = 0xC1, kSof2 = 0xC2;  // baseline, extended, progressive
constexpr unsigned kDht = 0xC4, kDqt = 0xDB, kSos = 0xDA, kEoi = 0xD9;
// stb decodes codes of up to FAST_BITS (9) bits with one table lookup.
constexpr int kStbFastBits = 9;

struct Component {
  unsigned id;
  unsigned quant_table;
};

class JpegTableCheck {
 public:
  JpegTableCheck(const unsigned char* b, size_t n, const std::string& name)
      : b_(b), n_(n), name_(name) {}

  void run() {
    size_t pos = 2;  // after the start-of-image marker FF D8
    while (pos + 1 < n_) {
      if (b_[pos] != 0xFF || b_[pos + 1] == 0xFF) {  // not a marker here, or a fill byte
        ++pos;
        continue;
      }
      const unsigned marker = b_[pos + 1];
      // In entropy-coded data: a stuffed 0xFF (FF 00) and restart markers FF D0..D7, no length.
      if (marker == 0x00 || (marker >= 0xD0 && marker <= 0xD7)) {
        pos += 2;
        continue;
      }
      if (marker == kEoi) return;
      const size_t length = byte16(pos + 2);  // includes its own two bytes
      const size_t body = pos + 4;
      if (marker == kDht) huffman_tables(body, length);
      if (marker == kDqt) quantization_tables(body, length);
      if ((marker == kSof0 || marker == kSof1 || marker == kSof2) && !frame_seen_) {
        frame(body, marker == kSof2);
      }
      if (marker == kSos) scan(body);
      pos += 2 + length;  // after a scan header, its entropy-coded data is walked above
    }
  }

 private:
  unsigned byte(size_t i) const { return i < n_ ? b_[i] : 0u; }
  size_t byte16(size_t i) const { return (byte(i) << 8) | byte(i + 1); }

  [[noreturn]] void corrupt(const std::string& why) const {
    throw Error(str("ImageFolder: ", name_, " is a corrupt JPEG: ", why), ErrorKind::Input);
  }

  // DHT: tables of (class << 4 | id, 16 code counts by length, the codes' values).
  void huffman_tables(size_t table, size_t length) {
    long remaining = static_cast<long>(length) - 2;
    while (remaining > 0) {
      const unsigned table_class = byte(table) >> 4, id = byte(table) & 15;
      unsigned counts[16], codes = 0;
      for (size_t i = 0; i < 16; ++i) {
        counts[i] = byte(table + 1 + i);
        codes += counts[i];
      }
      if (codes > 256) {
        corrupt(str("a Huffman table declares ", codes, " codes, more than the 256 JPEG allows"));
      }
      if (stb_misreads_huffman_table(counts)) {
        throw Error(str("ImageFolder: ", name_, " has a JPEG Huffman table of 256 codes none "
                        "longer than ", kStbFastBits, " bits, which the stb_image decoder "
                        "misreads: re-encode the image (a standard encoder writes at most 162 "
                        "codes per table)"), ErrorKind::Input);
      }
      if (table_class <= kAc && id < 4) huffman_defined_[table_class][id] = true;
      table += 17 + codes;
      remaining -= static_cast<long>(17 + codes);
    }
  }

  // DQT: tables of (precision << 4 | id, 64 values of 8 bits, or of 16 bits when precision is 1).
  void quantization_tables(size_t table, size_t length) {
    long remaining = static_cast<long>(length) - 2;
    while (remaining > 0) {
      const unsigned precision = byte(table) >> 4, id = byte(table) & 15;
      if (precision <= 1 && id < 4) quant_defined_[id] = true;
      const size_t step = precision == 0 ? 65 : 129;
      table += step;
      remaining -= static_cast<long>(step);
    }
  }

  // SOF0/1/2: precision, height, width, then (id, sampling, quantization table) per component.
  void frame(size_t body, bool progressive) {
    frame_seen_ = true;
    progressive_ = progressive;
    const unsigned count = byte(body + 5);
    for (unsigned c = 0; c < count; ++c) {
      components_.push_back({byte(body + 6 + 3 * c), byte(body + 8 + 3 * c)});
    }
  }

  // SOS: (component id, DC table << 4 | AC table) per component, then spectral start, spectral
  // end, and the successive-approximation bits (high << 4 | low). Which tables stb's scan
  // decodes with: a baseline or extended scan both; a progressive scan the DC table in a first
  // DC scan (start 0, high 0), none in a DC refinement scan, the AC table in an AC scan.
  void scan(size_t body) {
    ++scans_;
    if (!frame_seen_) return;  // stb refuses a scan before the frame header
    const unsigned count = byte(body);
    const unsigned spectral_start = byte(body + 1 + 2 * count);
    const unsigned approximation_high = byte(body + 3 + 2 * count) >> 4;
    const bool uses_dc = !progressive_ || (spectral_start == 0 && approximation_high == 0);
    const bool uses_ac = !progressive_ || spectral_start != 0;
    for (unsigned i = 0; i < count; ++i) {
      const unsigned id = byte(body + 1 + 2 * i), tables = byte(body + 2 + 2 * i);
      const Component* component = find_component(id);
      if (component == nullptr) continue;  // stb refuses a scan of an unknown component
      if (component->quant_table < 4 && !quant_defined_[component->quant_table]) {
        corrupt(str("component ", id, " of scan ", scans_, " uses quantization table ",
                    component->quant_table, ", which no DQT segment before the scan defines"));
      }
      if (uses_dc) require_huffman(kDc, tables >> 4, id);
      if (uses_ac) require_huffman(kAc, tables & 15, id);
    }
  }

  void require_huffman(unsigned table_class, unsigned id, unsigned component) const {
    if (id >= 4 || huffman_defined_[table_class][id]) return;  // stb refuses an id over 3
    corrupt(str("component ", component, " of scan ", scans_, " uses ",
                table_class == kDc ? "DC" : "AC", " Huffman table ", id,
                ", which no DHT segment before the scan defines"));
  }

  // stb matches a scan's component to the first frame component with its id.
  const Component* find_component(unsigned id) const {
    for (const Component& c : components_) {
      if (c.id == id) return &c;
    }
    return nullptr;
  }

  const unsigned char* b_;
  size_t n_;
  const std::string& name_;
  bool huffman_defined_[2][4] = {};
  bool quant_defined_[4] = {};
  bool frame_seen_ = false;
  bool progressive_ = false;
  std::vector<Component> components_;
  int scans_ = 0;
};

}  // namespace

bool stb_misreads_huffman_table(const unsigned counts[16]) {
  unsigned codes = 0;
  int longest = 0;
  for (int bits = 1; bits <= 16; ++bits) {
    codes += counts[bits - 1];
    if (counts[bits - 1] != 0) longest = bits;
  }
  return codes == 256 && longest <= kStbFastBits;
}

void check_jpeg_tables(const unsigned char* bytes, size_t size, const std::string& name) {
  JpegTableCheck(bytes, size, name).run();
}

}  // namespace kiln::detail
