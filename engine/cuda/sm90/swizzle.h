// sm90/swizzle.h: the shared-memory swizzle modes of Hopper (compute capability 9.0), which the
// Tensor Memory Accelerator writes (a tensor map's CU_TENSOR_MAP_SWIZZLE_*) and warpgroup MMA
// reads (a matrix descriptor's swizzle field). Both sides must name the same mode for the same
// tile: the TMA stores a tile swizzled, wgmma undoes the swizzle when it reads.
//
// Why swizzle. A tile row of 64 bf16 elements is 128 bytes, all 32 banks of shared memory. The
// eight rows of an 8x8 core matrix that an MMA reads at once would then all start in bank 0:
// an 8-way bank conflict. Swizzling XORs the 16-byte chunk index of an address with its row
// index within an atom of 8 rows, so the 8 rows' chunk c land in 8 different chunks (and banks).
//
// The modes, as functions of a shared-memory byte address (CUTLASS names them Swizzle<B,4,3>,
// cute/swizzle.hpp; PTX ISA, "Asynchronous Warpgroup Level Matrix Shared Memory Layout",
// https://docs.nvidia.com/cuda/parallel-thread-execution/#asynchronous-warpgroup-level-matrix-shared-memory-layout):
//   None   the address itself
//   B32    bit 4 ^= bit 7                 (a 32-byte row, atoms of 8 rows x 32 B = 256 B)
//   B64    bits 4-5 ^= bits 7-8           (64-byte rows, atoms of 512 B)
//   B128   bits 4-6 ^= bits 7-9           (128-byte rows, atoms of 1024 B)
// The XOR uses the address's own bits, so a swizzled tile must start on its atom's boundary
// (1024 bytes for B128); both the TMA and wgmma assume it. Within a 16-byte chunk nothing moves.
#pragma once

#include <cstdint>

namespace kiln::cuda::sm90 {

enum class Swizzle : uint8_t { None, B32, B64, B128 };

// The row length of the mode in bytes (the TMA's box inner dimension may not exceed it), and the
// alignment a swizzled tile needs: 8 such rows.
constexpr uint32_t swizzle_row_bytes(Swizzle s) {
  return s == Swizzle::B32 ? 32u : s == Swizzle::B64 ? 64u : s == Swizzle::B128 ? 128u : 16u;
}
constexpr uint32_t swizzle_atom_bytes(Swizzle s) { return 8u * swizzle_row_bytes(s); }

// Where byte `address` of an unswizzled tile is stored under mode s (an involution: applying it
// twice gives the address back).
constexpr uint32_t swizzle_address(Swizzle s, uint32_t address) {
  const uint32_t bits = s == Swizzle::B32 ? 1u : s == Swizzle::B64 ? 2u : s == Swizzle::B128 ? 3u : 0u;
  const uint32_t mask = (1u << bits) - 1u;
  return address ^ (((address >> 7) & mask) << 4);
}

}  // namespace kiln::cuda::sm90
