// image_folder_test.cpp: ImageFolderDataset on small folders of PNG (and one JPEG) files
// written here with stb_image_write: class order and labels, file order, exact decoded values
// (PNG is lossless), grey <-> RGB, resizing to the options and to the first image's size,
// ignored files, every error (each naming the file or folder), the pixel budget and the
// PNG/JPEG-only rule for untrusted files, concurrent get() from several threads, and the
// IDX -> PNG export of apps/idx_to_imagefolder (data/idx_export.h) read back byte for byte.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "stb_image_write.h"

#include "data/idx_export.h"
#include "data/image_folder.h"
#include "data/mnist.h"
#include "engine/error.h"
#include "image_bytes.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

// Pixel k (HWC order) of test image `seed`: distinct, spread over 0..255.
Bytes pattern(int h, int w, int c, int seed) {
  Bytes b(static_cast<size_t>(h * w * c));
  for (size_t k = 0; k < b.size(); ++k) b[k] = static_cast<uint8_t>((seed * 37 + k * 11) % 256);
  return b;
}

void write_png(const fs::path& file, int h, int w, int c, const Bytes& hwc) {
  fs::create_directories(file.parent_path());
  ASSERT_TRUE(stbi_write_png(file.string().c_str(), w, h, c, hwc.data(), w * c)) << file;
}

void write_text(const fs::path& file, const std::string& text) {
  fs::create_directories(file.parent_path());
  std::ofstream(file) << text;
}

std::vector<float> get(const ImageFolderDataset& ds, int64_t i, int64_t* label = nullptr) {
  std::vector<float> out(static_cast<size_t>(shape_numel(ds.example_shape())), -1.0f);
  const int64_t l = ds.get(i, out.data());
  if (label) *label = l;
  return out;
}

// HWC bytes -> CHW floats / 255, what get() must return for an image of the right size.
std::vector<float> chw01(const Bytes& hwc, int h, int w, int c) {
  std::vector<float> v(hwc.size());
  for (int ch = 0; ch < c; ++ch) {
    for (int k = 0; k < h * w; ++k) v[ch * h * w + k] = static_cast<float>(hwc[k * c + ch]) / 255.0f;
  }
  return v;
}

std::string error_of(const std::function<void()>& f, ErrorKind* kind = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (kind) *kind = e.kind();
    return e.what();
  }
  return "(no error)";
}

class ImageFolder : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("kiln_image_folder_test_" + std::to_string(getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string root() const { return dir_.string(); }
  fs::path dir_;
};

TEST_F(ImageFolder, ClassesFilesLabelsAndExactValues) {
  // Class names in byte order: "10" < "2" < "Bird" < "ant".
  const std::vector<std::string> classes = {"ant", "Bird", "2", "10"};
  for (size_t c = 0; c < classes.size(); ++c) {
    for (int f = 2; f >= 0; --f) {  // created in reverse; listed sorted
      write_png(dir_ / classes[c] / ("img" + std::to_string(f) + (f == 1 ? ".PNG" : ".png")), 3, 4,
                1, pattern(3, 4, 1, static_cast<int>(c * 3 + f)));
    }
  }
  write_text(dir_ / "ant" / "notes.txt", "not an image");
  write_text(dir_ / "ant" / ".hidden.png", "hidden files are never read");
  write_text(dir_ / "README", "a file in root is not a class");
  fs::create_directories(dir_ / ".cache");
  write_png(dir_ / ".cache" / "x.png", 3, 4, 1, pattern(3, 4, 1, 0));
  fs::create_directories(dir_ / "ant" / "sub");  // not recursed into

  const ImageFolderDataset ds = ImageFolderDataset::open(root());
  EXPECT_EQ(ds.classes(), (std::vector<std::string>{"10", "2", "Bird", "ant"}));
  EXPECT_EQ(ds.size(), 12);
  EXPECT_EQ(ds.num_classes(), 4);
  EXPECT_EQ(ds.example_shape(), (Shape{1, 3, 4}));
  EXPECT_EQ(ds.ignored_files(), 1);
  EXPECT_NE(ds.describe().find("12 images of [1, 3, 4] in 4 classes (1 files with other"),
            std::string::npos) << ds.describe();
  for (int64_t i = 0; i < 12; ++i) {
    const int64_t label = i / 3, f = i % 3;
    const std::string& name = ds.classes()[static_cast<size_t>(label)];
    const size_t c = static_cast<size_t>(std::find(classes.begin(), classes.end(), name) - classes.begin());
    EXPECT_EQ(fs::path(ds.path(i)).filename().string(),
              "img" + std::to_string(f) + (f == 1 ? ".PNG" : ".png"));
    int64_t got_label = -1;
    EXPECT_EQ(get(ds, i, &got_label), chw01(pattern(3, 4, 1, static_cast<int>(c * 3 + f)), 3, 4, 1));
    EXPECT_EQ(got_label, label);
    EXPECT_EQ(ds.label(i), label);
  }
  EXPECT_THROW(get(ds, 12), Error);
}

TEST_F(ImageFolder, RgbGreyConversions) {
  const Bytes rgb = pattern(2, 3, 3, 5), grey = pattern(2, 3, 1, 6);
  write_png(dir_ / "a" / "0.png", 2, 3, 3, rgb);
  write_png(dir_ / "b" / "1.png", 2, 3, 1, grey);
  // Default: channels of the first image (RGB); the grey file is replicated to R = G = B.
  const ImageFolderDataset colour = ImageFolderDataset::open(root());
  EXPECT_EQ(colour.example_shape(), (Shape{3, 2, 3}));
  EXPECT_EQ(get(colour, 0), chw01(rgb, 2, 3, 3));
  Bytes grey3;
  for (uint8_t g : grey) grey3.insert(grey3.end(), {g, g, g});
  EXPECT_EQ(get(colour, 1), chw01(grey3, 2, 3, 3));
  // Forced grey: stb's luma (77 R + 150 G + 29 B) >> 8.
  ImageFolderOptions opt;
  opt.channels = 1;
  const ImageFolderDataset mono = ImageFolderDataset::open(root(), opt);
  EXPECT_EQ(mono.example_shape(), (Shape{1, 2, 3}));
  Bytes luma;
  for (size_t k = 0; k < rgb.size(); k += 3) {
    luma.push_back(static_cast<uint8_t>((rgb[k] * 77 + rgb[k + 1] * 150 + rgb[k + 2] * 29) >> 8));
  }
  EXPECT_EQ(get(mono, 0), chw01(luma, 2, 3, 1));
  EXPECT_EQ(get(mono, 1), chw01(grey, 2, 3, 1));
  // RGBA: alpha dropped by default.
  write_png(dir_ / "0rgba" / "0.png", 2, 3, 4, pattern(2, 3, 4, 7));
  EXPECT_EQ(ImageFolderDataset::open(root()).example_shape(), (Shape{3, 2, 3}));
}

TEST_F(ImageFolder, ResizesToOptionsAndToTheFirstImage) {
  write_png(dir_ / "a" / "0.png", 4, 4, 1, Bytes(16, 200));  // constant
  write_png(dir_ / "a" / "1.png", 6, 10, 1, pattern(6, 10, 1, 1));  // another size
  write_png(dir_ / "b" / "2.jpeg", 4, 4, 3, Bytes(48, 90));
  ASSERT_TRUE(stbi_write_jpg((dir_ / "b" / "3.JPG").string().c_str(), 4, 4, 1, Bytes(16, 60).data(), 95));
  const ImageFolderDataset first = ImageFolderDataset::open(root());
  EXPECT_EQ(first.example_shape(), (Shape{1, 4, 4}));
  EXPECT_EQ(get(first, 0), std::vector<float>(16, 200 / 255.0f));
  EXPECT_EQ(get(first, 1).size(), 16u);  // 6x10 resized to 4x4
  for (float v : get(first, 1)) {
    EXPECT_GE(v, 0.0f);
    EXPECT_LE(v, 1.0f);
  }
  EXPECT_EQ(get(first, 2), std::vector<float>(16, 90 / 255.0f));  // RGB constant -> grey constant
  for (float v : get(first, 3)) EXPECT_NEAR(v, 60 / 255.0f, 2 / 255.0f);  // JPEG: lossy
  ImageFolderOptions opt;
  opt.height = 7;
  opt.width = 5;
  opt.channels = 3;
  const ImageFolderDataset sized = ImageFolderDataset::open(root(), opt);
  EXPECT_EQ(sized.example_shape(), (Shape{3, 7, 5}));
  EXPECT_EQ(get(sized, 0), std::vector<float>(105, 200 / 255.0f));  // constant stays constant
  opt.width = 0;
  EXPECT_THROW(ImageFolderDataset::open(root(), opt), Error);  // height without width
  opt.width = 5;
  opt.channels = 2;
  EXPECT_THROW(ImageFolderDataset::open(root(), opt), Error);
}

TEST_F(ImageFolder, ErrorsNameTheFileOrFolder) {
  ErrorKind kind = ErrorKind::Runtime;
  std::string msg = error_of([&] { ImageFolderDataset::open(root() + "/missing"); }, &kind);
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
  EXPECT_EQ(kind, ErrorKind::Input);
  msg = error_of([&] { ImageFolderDataset::open(root()); }, &kind);  // empty
  EXPECT_NE(msg.find("no class directories"), std::string::npos) << msg;
  EXPECT_EQ(kind, ErrorKind::Input);
  write_text(dir_ / "only_text" / "a.txt", "x");
  msg = error_of([&] { ImageFolderDataset::open(root()); }, &kind);
  EXPECT_NE(msg.find("only_text"), std::string::npos) << msg;
  EXPECT_EQ(kind, ErrorKind::Input);
  fs::remove_all(dir_ / "only_text");

  // A truncated PNG that is not the first file: open() succeeds, get() names it and says why.
  write_png(dir_ / "a" / "0.png", 8, 8, 1, pattern(8, 8, 1, 1));
  write_png(dir_ / "a" / "1.png", 8, 8, 1, pattern(8, 8, 1, 2));
  const fs::path bad = dir_ / "a" / "1.png";
  fs::resize_file(bad, fs::file_size(bad) / 2);
  write_text(dir_ / "a" / "2.png", "this is not a PNG");
  const ImageFolderDataset ds = ImageFolderDataset::open(root());
  EXPECT_EQ(get(ds, 0), chw01(pattern(8, 8, 1, 1), 8, 8, 1));
  for (int64_t i : {1, 2}) {
    msg = error_of([&] { get(ds, i); }, &kind);
    EXPECT_NE(msg.find(ds.path(i)), std::string::npos) << msg;
    EXPECT_NE(msg.find(i == 1 ? "is a corrupt PNG" : "neither a PNG nor a JPEG"), std::string::npos)
        << msg;
    EXPECT_EQ(kind, ErrorKind::Input);
  }
  // A file removed after open().
  fs::remove(dir_ / "a" / "0.png");
  msg = error_of([&] { get(ds, 0); }, &kind);
  EXPECT_NE(msg.find("cannot open"), std::string::npos) << msg;
}

// A root that cannot be reached says the system's reason, not "does not exist": a loop of
// symbolic links (ELOOP) fails for root too; a directory that may not be searched (EACCES) only
// for other users (root ignores permission bits), so that half skips as root.
TEST_F(ImageFolder, UnreachableRootSaysTheSystemsReason) {
  const fs::path loop = dir_ / "loop";
  fs::create_directory_symlink(loop, loop);  // loop -> loop
  ErrorKind kind = ErrorKind::Runtime;
  std::string msg = error_of([&] { ImageFolderDataset::open((loop / "train").string()); }, &kind);
  EXPECT_EQ(kind, ErrorKind::Input);
  EXPECT_NE(msg.find((loop / "train").string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("Too many levels of symbolic links"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("does not exist"), std::string::npos) << msg;
  if (geteuid() == 0) GTEST_SKIP() << "root ignores permission bits: the EACCES half is skipped";
  write_png(dir_ / "locked" / "train" / "a" / "0.png", 4, 4, 1, pattern(4, 4, 1, 1));
  fs::permissions(dir_ / "locked", fs::perms::none);
  msg = error_of([&] { ImageFolderDataset::open((dir_ / "locked" / "train").string()); }, &kind);
  fs::permissions(dir_ / "locked", fs::perms::owner_all);
  EXPECT_NE(msg.find((dir_ / "locked" / "train").string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("Permission denied"), std::string::npos) << msg;
}

// Train and test splits number their class folders each on its own: different folders would
// shift the labels, so check_same_classes refuses them naming the classes found in one only.
TEST_F(ImageFolder, SplitsWithDifferentClassFoldersAreRefused) {
  for (const char* c : {"ant", "bee", "cat"}) {
    write_png(dir_ / "train" / c / "0.png", 4, 4, 1, pattern(4, 4, 1, 1));
  }
  for (const char* c : {"ant", "cat", "dog"}) {
    write_png(dir_ / "test" / c / "0.png", 4, 4, 1, pattern(4, 4, 1, 2));
  }
  const ImageFolderDataset train = ImageFolderDataset::open((dir_ / "train").string());
  const ImageFolderDataset test = ImageFolderDataset::open((dir_ / "test").string());
  ErrorKind kind = ErrorKind::Runtime;
  const std::string msg = error_of([&] { check_same_classes(train, test); }, &kind);
  EXPECT_EQ(kind, ErrorKind::Input);
  EXPECT_NE(msg.find("only in " + (dir_ / "train").string() + ": bee"), std::string::npos) << msg;
  EXPECT_NE(msg.find("only in " + (dir_ / "test").string() + ": dog"), std::string::npos) << msg;
  // The same folders pass, whatever the files in them.
  fs::remove_all(dir_ / "test" / "dog");
  write_png(dir_ / "test" / "bee" / "7.png", 4, 4, 1, pattern(4, 4, 1, 3));
  check_same_classes(train, ImageFolderDataset::open((dir_ / "test").string()));
}

// Untrusted files: an image over the pixel budget is refused from its header, before any pixel
// is decoded (a forged 16384x16384 header would otherwise make stb allocate 256 MB for a 2 KB
// file), and content other than PNG or JPEG (stb would also decode this BMP) is refused under
// any name.
TEST_F(ImageFolder, RefusesImagesOverThePixelBudgetAndOtherFormats) {
  ErrorKind kind = ErrorKind::Runtime;
  write_png(dir_ / "a" / "0.png", 32, 64, 1, pattern(32, 64, 1, 1));  // 64x32 = 2048 pixels
  ImageFolderOptions options;
  options.max_pixels = 2047;
  std::string msg = error_of([&] { ImageFolderDataset::open(root(), options); }, &kind);
  EXPECT_NE(msg.find("0.png"), std::string::npos) << msg;
  EXPECT_NE(msg.find("64x32 = 2048 pixels"), std::string::npos) << msg;
  EXPECT_NE(msg.find("limit of 2047"), std::string::npos) << msg;
  EXPECT_EQ(kind, ErrorKind::Input);
  options.max_pixels = 2048;  // exactly the image: accepted, and decoded exactly
  EXPECT_EQ(get(ImageFolderDataset::open(root(), options), 0), chw01(pattern(32, 64, 1, 1), 32, 64, 1));

  // A PNG whose header announces 16384x16384, its CRC recomputed (stb_image refuses by itself
  // only images of more than 2^30 bytes): refused by the default budget when get() reads it as
  // a file that is not the first, and when open() reads it as the first.
  std::ifstream in(dir_ / "a" / "0.png", std::ios::binary);
  std::string png((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(png.substr(12, 4), "IHDR");
  const std::string big = png.substr(0, 16) + std::string("\0\0\x40\0\0\0\x40\0", 8) + png.substr(24);
  test::Bytes big_bytes(big.begin(), big.end());
  test::fix_png_crcs(big_bytes);
  std::ofstream(dir_ / "a" / "1.png", std::ios::binary)
      .write(reinterpret_cast<const char*>(big_bytes.data()), static_cast<std::streamsize>(big_bytes.size()));
  const ImageFolderDataset ds = ImageFolderDataset::open(root());
  msg = error_of([&] { get(ds, 1); }, &kind);
  EXPECT_NE(msg.find("1.png is 16384x16384 = 268435456 pixels"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(kImageMaxPixels)), std::string::npos) << msg;
  EXPECT_EQ(kind, ErrorKind::Input);
  fs::remove(dir_ / "a" / "0.png");
  msg = error_of([&] { ImageFolderDataset::open(root()); }, &kind);
  EXPECT_NE(msg.find("1.png is 16384x16384"), std::string::npos) << msg;
  fs::remove(dir_ / "a" / "1.png");

  const Bytes grey = pattern(8, 8, 1, 3);
  ASSERT_TRUE(stbi_write_bmp((dir_ / "a" / "2.png").string().c_str(), 8, 8, 1, grey.data()));
  msg = error_of([&] { ImageFolderDataset::open(root()); }, &kind);
  EXPECT_NE(msg.find("2.png is neither a PNG nor a JPEG"), std::string::npos) << msg;
  EXPECT_EQ(kind, ErrorKind::Input);
  options.max_pixels = 0;
  msg = error_of([&] { ImageFolderDataset::open(root(), options); }, &kind);
  EXPECT_NE(msg.find("max_pixels 0"), std::string::npos) << msg;
  EXPECT_EQ(kind, ErrorKind::Usage);
}

// A JPEG whose Huffman table declares more than 256 codes (stb_image 2.27 would write past its
// tables: found by tests/fuzz/image_decode) is refused before stb decodes it; the same file with
// its counts intact decodes.
TEST_F(ImageFolder, RefusesAJpegHuffmanTableOfMoreThan256Codes) {
  const Bytes rgb = pattern(8, 8, 3, 5);
  std::string jpg;
  stbi_write_jpg_to_func([](void* ctx, void* data, int size) {
    static_cast<std::string*>(ctx)->append(static_cast<const char*>(data), static_cast<size_t>(size));
  }, &jpg, 8, 8, 3, rgb.data(), 90);
  const size_t dht = jpg.find("\xFF\xC4");
  ASSERT_NE(dht, std::string::npos);
  fs::create_directories(dir_ / "a");
  std::ofstream(dir_ / "a" / "0.jpg", std::ios::binary) << jpg;
  EXPECT_EQ(get(ImageFolderDataset::open(root()), 0).size(), 3u * 8 * 8);
  // The first table's counts are bytes dht+5 .. dht+20; 255 more 16-bit codes.
  jpg[dht + 20] = static_cast<char>(static_cast<unsigned char>(jpg[dht + 20]) + 255);
  std::ofstream(dir_ / "a" / "1.jpg", std::ios::binary) << jpg;
  ErrorKind kind = ErrorKind::Runtime;
  const std::string msg = error_of([&] { get(ImageFolderDataset::open(root()), 1); }, &kind);
  EXPECT_NE(msg.find("1.jpg is a corrupt JPEG: a Huffman table declares"), std::string::npos) << msg;
  EXPECT_NE(msg.find("more than the 256 JPEG allows"), std::string::npos) << msg;
  EXPECT_EQ(kind, ErrorKind::Input);
}

TEST_F(ImageFolder, ConcurrentGetMatchesSerialAndErrorsStayPerThread) {
  for (int i = 0; i < 24; ++i) {
    write_png(dir_ / std::to_string(i % 3) / (std::to_string(i) + ".png"), 9, 7, 3, pattern(9, 7, 3, i));
  }
  // Two broken files with different stb reasons, decoded by different threads at once: each
  // thread must report its own file's reason (stb's failure reason is thread-local).
  write_png(dir_ / "2" / "zz_bad_0.png", 9, 7, 3, pattern(9, 7, 3, 99));
  {  // IDAT's zlib header (as below): deflate with a preset dictionary, "no preset dict"
    std::fstream f(dir_ / "2" / "zz_bad_0.png", std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(8 + 25 + 8);
    f.write("\x78\xBB", 2);
  }
  write_png(dir_ / "2" / "zz_bad_1.png", 9, 7, 3, pattern(9, 7, 3, 98));
  {  // the first two bytes of IDAT's zlib stream (after signature, IHDR, IDAT length and type)
    std::fstream f(dir_ / "2" / "zz_bad_1.png", std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(8 + 25 + 8);
    f.write("\xFF\xFF", 2);  // not a zlib header: "bad zlib header"
  }
  // Their CRCs recomputed, so that the damage reaches stb rather than Kiln's CRC check.
  for (const char* name : {"zz_bad_0.png", "zz_bad_1.png"}) {
    std::ifstream in(dir_ / "2" / name, std::ios::binary);
    test::Bytes png((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    in.close();
    test::fix_png_crcs(png);
    std::ofstream(dir_ / "2" / name, std::ios::binary)
        .write(reinterpret_cast<const char*>(png.data()), static_cast<std::streamsize>(png.size()));
  }
  const ImageFolderDataset ds = ImageFolderDataset::open(root());
  const int64_t good = ds.size() - 2, numel = shape_numel(ds.example_shape());
  std::vector<float> serial(static_cast<size_t>(good * numel)), threaded(serial.size());
  for (int64_t i = 0; i < good; ++i) ds.get(i, serial.data() + i * numel);
  std::vector<std::vector<std::string>> errors(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 20; ++rep) {
        for (int64_t i = t; i < good; i += 4) ds.get(i, threaded.data() + i * numel);
        errors[t].push_back(error_of([&] { get(ds, good + t % 2); }));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(serial, threaded);
  for (int t = 0; t < 4; ++t) {
    const std::string file = t % 2 ? "zz_bad_1.png: bad zlib header" : "zz_bad_0.png: no preset dict";
    for (const std::string& e : errors[t]) EXPECT_NE(e.find(file), std::string::npos) << e;
  }
}

// ---- IDX -> ImageFolder export (apps/idx_to_imagefolder) ----------------------------------

void put_be32(Bytes& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(v >> s));
}

void write_bytes(const fs::path& file, const Bytes& b) {
  std::ofstream(file, std::ios::binary).write(reinterpret_cast<const char*>(b.data()),
                                              static_cast<std::streamsize>(b.size()));
}

TEST_F(ImageFolder, IdxExportRoundTripsTheBytes) {
  const uint32_t count = 23;
  Bytes images, labels;
  put_be32(images, 2051);
  put_be32(images, count);
  put_be32(images, 28);
  put_be32(images, 28);
  put_be32(labels, 2049);
  put_be32(labels, count);
  for (uint32_t i = 0; i < count; ++i) {
    for (uint32_t k = 0; k < 784; ++k) images.push_back(static_cast<uint8_t>((i * 31 + k * 7) % 256));
    labels.push_back(static_cast<uint8_t>((i * 7) % 10));
  }
  write_bytes(dir_ / "images", images);
  write_bytes(dir_ / "labels", labels);
  const MnistDataset mnist =
      MnistDataset::load_files((dir_ / "images").string(), (dir_ / "labels").string());
  const std::string out = (dir_ / "png" / "train").string();
  fs::create_directories(dir_ / "png");
  fs::create_directories(out + ".tmp/junk");  // left by an interrupted run: replaced

  const IdxExportResult r = export_idx_split(mnist, out);
  EXPECT_EQ(r.files, count);
  EXPECT_FALSE(r.skipped);
  EXPECT_FALSE(fs::exists(out + ".tmp"));
  EXPECT_TRUE(fs::exists(out + "/7/01.png"));  // index 1, label 1 * 7 % 10, zero-padded
  const ImageFolderDataset folder = ImageFolderDataset::open(out);
  ASSERT_EQ(folder.size(), count);
  EXPECT_EQ(folder.example_shape(), (Shape{1, 28, 28}));
  EXPECT_EQ(folder.ignored_files(), 0);  // the hidden completion marker is not counted
  for (int64_t i = 0; i < folder.size(); ++i) {
    // The file name is the IDX index; the class directory its label.
    const int64_t idx = std::stoll(fs::path(folder.path(i)).stem().string());
    int64_t label = -1;
    const std::vector<float> px = get(folder, i, &label);
    EXPECT_EQ(folder.classes()[static_cast<size_t>(label)], std::to_string(mnist.label(idx)));
    const uint8_t* want = mnist.image_bytes(idx);
    for (int k = 0; k < 784; ++k) ASSERT_EQ(px[k], want[k] / 255.0f) << "index " << idx << " pixel " << k;
  }
  // Idempotent: a complete split is skipped; a different count is refused.
  EXPECT_TRUE(export_idx_split(mnist, out).skipped);
  const MnistDataset fewer =
      MnistDataset::load_files((dir_ / "images").string(), (dir_ / "labels").string(), 5);
  ErrorKind kind = ErrorKind::Runtime;
  const std::string msg = error_of([&] { export_idx_split(fewer, out); }, &kind);
  EXPECT_NE(msg.find("holds 23 images, not the 5"), std::string::npos) << msg;
  EXPECT_EQ(kind, ErrorKind::Input);
}

}  // namespace
}  // namespace kiln
