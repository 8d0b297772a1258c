// Private to flash_attention_fwd.cu / flash_attention_bwd.cu: the PTX wrappers, the swizzled
// shared-memory tile layout, and the warp-level tensor-core GEMM both passes are built from.
//
// ---------------------------------------------------------------------------------------------
// Fragment layouts this code relies on (PTX ISA, "Matrix Fragments for mma.m16n8k16" with
// .bf16 inputs and .f32 accumulators, and "ldmatrix"). Throughout:
//     lane = threadIdx.x % 32,  g = lane >> 2 ("groupID"),  t = lane & 3 ("threadID_in_group").
// A .b32 register holding two bf16 keeps the element with the smaller column (or k) index in
// its low 16 bits; __floats2bfloat162_rn(lo, hi) builds exactly that (.x = lo = low half).
//
//  mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32  D[16x8] = A[16x16] * B[16x8] + C
//   (Here a0..a3 and b0, b1 name .b32 registers; the PTX ISA numbers the bf16 elements, so our
//   register a0 = its elements {a0, a1}, a1 = {a2, a3}, a2 = {a4, a5}, a3 = {a6, a7}, and
//   b0 = {b0, b1}, b1 = {b2, b3}; the lower-numbered element is in the low half.)
//   A (4 regs a0..a3, 2 bf16 each), row = m, col = k:
//     a0 = A[g    ][2t, 2t+1]      a1 = A[g + 8][2t, 2t+1]
//     a2 = A[g    ][2t+8, 2t+9]    a3 = A[g + 8][2t+8, 2t+9]
//   B (2 regs b0, b1), row = k, col = n:
//     b0 = B[2t, 2t+1][g]          b1 = B[2t+8, 2t+9][g]
//   C / D (4 floats c0..c3):
//     c0, c1 = C[g    ][2t, 2t+1]  c2, c3 = C[g + 8][2t, 2t+1]
//
//  ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 {r0, r1, r2, r3}, [addr]
//   Lanes 8i .. 8i+7 give the addresses of rows 0..7 of matrix i (16 contiguous bytes each,
//   16-byte aligned). Result register ri holds two b16 of matrix i:
//     without .trans: ri = M_i[g][2t, 2t+1]        (row g, columns 2t and 2t+1)
//     with    .trans: ri = M_i[2t][g], M_i[2t+1][g] (column g, rows 2t and 2t+1)
//
//  Consequences used below (each derived lane by lane in the comments of the frag_* functions):
//   * A 16x16 A-operand tile stored row-major as [m][k]: plain ldmatrix, matrices
//     (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15) -> a0..a3.
//   * An A tile stored as [k][m] (we need A = X^T of a row-major X): ldmatrix.trans of the
//     stored blocks (k 0-7, m 0-7), (k 0-7, m 8-15), (k 8-15, m 0-7), (k 8-15, m 8-15).
//   * B stored as [n][k] (B = X^T of a row-major X, e.g. K in Q K^T): plain ldmatrix,
//     16 n-columns x 16 k at once: (n 0-7, k 0-7) -> b0 of n-block 0, (n 0-7, k 8-15) -> b1
//     of n-block 0, (n 8-15, k 0-7) -> b0 of n-block 1, (n 8-15, k 8-15) -> b1 of n-block 1.
//   * B stored as [k][n] (row-major B, e.g. V in P V): ldmatrix.trans of the stored blocks
//     (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15), same order.
//   * An accumulator tile C[16 x 16] held as two n-blocks c[0], c[1] becomes, packed to bf16,
//     the A operand of the next product with k = those 16 columns:
//       a0 = pack(c[0][0], c[0][1])  a1 = pack(c[0][2], c[0][3])
//       a2 = pack(c[1][0], c[1][1])  a3 = pack(c[1][2], c[1][3])
//     (FlashAttention-2's register reuse of P as the A operand of P V.)
//
// Shared-memory tiles are row-major, rows of W bf16 (W = 64 or 128, i.e. 8 or 16 chunks of 16
// bytes). The 16-byte chunk c of row r is stored at chunk position c ^ (r & 7): the eight rows
// that one ldmatrix phase (or one cp.async wave of a row-chunk) touches land in eight distinct
// 16-byte bank groups, so neither the cp.async writes, nor ldmatrix (plain or .trans), nor the
// 4-byte stores of P / dS fragments conflict. Only the low three bits of c change, so a chunk
// never leaves its row.
// ---------------------------------------------------------------------------------------------
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace primus::cuda::fa {

using bf16 = __nv_bfloat16;

constexpr float kLog2e = 1.4426950408889634f;

// ---- PTX wrappers ----

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy; bytes beyond src_bytes (0 or 16) are zero-filled and not read.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// volatile: the loads must stay between the barriers that order them (the compiler would
// otherwise treat them as pure and hoist or merge them across iterations).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c += A * B for one m16n8k16 tile (layouts above).
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x (MUFU.EX2); 2^-inf = +0, which is how masked scores become probability 0.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Two floats -> bf16x2 with `lo` in the low half (the smaller column index).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// ---- Swizzled tiles ----

// Byte offset of element (row, col) in a tile of rows of W bf16; col is a multiple of 8 for
// ldmatrix / cp.async addresses, any even column for the 4-byte fragment stores.
template <int W>
__device__ __forceinline__ uint32_t swz(int row, int col) {
  static_assert(W % 64 == 0, "rows of whole 128-byte swizzle periods");
  return uint32_t(row * (W * 2) + (((col >> 3) ^ (row & 7)) << 4) + ((col & 7) << 1));
}

// Copies rows [0, ROWS) x columns [0, W) of a row-major bf16 matrix (row stride `stride`
// elements, starting at `src`) into a swizzled tile. Rows >= rows_valid are zero-filled and their
// memory is not read; their cp.async is given `safe`, any valid global address, instead.
//
// Thread tid copies chunk c = tid % (W/8) of rows r = tid / (W/8), r + kRowStep, r + 2*kRowStep,
// ... with kRowStep = NTHREADS / (W/8) a multiple of 8, so all of its rows share one swizzle and
// their shared addresses differ by whole rows (immediates).
template <int ROWS, int W, int NTHREADS>
__device__ __forceinline__ void load_tile(uint32_t tile, const bf16* src, int stride, int rows_valid, const bf16* safe,
                                          int tid) {
  constexpr int kChunks = W / 8;
  constexpr int kRowStep = NTHREADS / kChunks;
  static_assert(NTHREADS % kChunks == 0 && ROWS % kRowStep == 0 && kRowStep % 8 == 0, "whole waves");
  const int r = tid / kChunks, c = tid % kChunks;
  const uint32_t dst = tile + swz<W>(r, c * 8);
  const bf16* s = src + int64_t(r) * stride + c * 8;
  const int64_t step = int64_t(kRowStep) * stride;
  const int left = rows_valid - r;  // row r + i*kRowStep is valid iff i*kRowStep < left
#pragma unroll
  for (int i = 0; i < ROWS / kRowStep; ++i) {
    const bool ok = i * kRowStep < left;
    cp_async16(dst + uint32_t(i * kRowStep * 2 * W), ok ? s + i * step : safe, ok ? 16 : 0);
  }
}

// ---- Fragment loads (see the layout notes at the top) ----
//
// Every ldmatrix address below has the form swz<W>(R + rl, C + cl): R, C are compile-time
// multiples of 16 (after unrolling) and rl in [0, 16), cl in {0, 8} depend on the lane only.
// Because R is a multiple of 8, (R + rl) & 7 = rl & 7, and because C/8 is even and C < W,
//     swz<W>(R + rl, C + cl) = R * 2W + (swz<W>(rl, cl) ^ (2C))
// (the XOR touches only bits 4-7 of a value below 2W, a power of two, so it never meets rl*2W).
// So a lane computes swz(rl, cl) once per operand (a Frag), and each load adds a constant row
// offset and XORs a constant: no per-(row, column) address registers.
struct Frag {
  uint32_t off;  // swz(rl, cl) of this lane
};

// A tile rows [r0, r0+16) x k [k0, k0+16) of A stored [m][k] (tile row width W).
// Lane L addresses row r0 + (L & 15), column k0 + (L >> 4) * 8: lanes 0-7 -> (m 0-7, k 0-7) = a0,
// 8-15 -> (m 8-15, k 0-7) = a1, 16-23 -> (m 0-7, k 8-15) = a2, 24-31 -> (m 8-15, k 8-15) = a3.
template <int W>
__device__ __forceinline__ Frag frag_a_mk(int lane) {
  return {swz<W>(lane & 15, (lane >> 4) << 3)};
}
// Same A tile, stored transposed as [k][m]. Lane L addresses stored row k0 + (L >> 4) * 8 + (L & 7),
// stored column r0 + ((L >> 3) & 1) * 8: lanes 0-7 -> (k 0-7, m 0-7) = a0, 8-15 -> (k 0-7, m 8-15)
// = a1, 16-23 -> (k 8-15, m 0-7) = a2, 24-31 -> (k 8-15, m 8-15) = a3; .trans hands lane (g, t)
// the stored elements [2t, 2t+1][g] = A[g][2t, 2t+1] of each.
template <int W>
__device__ __forceinline__ Frag frag_a_km(int lane) {
  return {swz<W>(((lane >> 4) << 3) + (lane & 7), ((lane >> 3) & 1) << 3)};
}
// B for n-blocks [n0, n0+8) and [n0+8, n0+16), k [k0, k0+16), B stored [n][k]. Lane L addresses
// stored row n0 + (L >> 4) * 8 + (L & 7), column k0 + ((L >> 3) & 1) * 8: b[0], b[1] = b0, b1 of
// n-block 0; b[2], b[3] = b0, b1 of n-block 1. Plain ldmatrix gives lane (g, t) stored
// [g][2t, 2t+1] = B[k 2t, 2t+1][n g].
template <int W>
__device__ __forceinline__ Frag frag_b_nk(int lane) {
  return {swz<W>(((lane >> 4) << 3) + (lane & 7), ((lane >> 3) & 1) << 3)};
}
// Same B fragments, B stored [k][n]. Lane L addresses stored row k0 + ((L >> 3) & 1) * 8 + (L & 7),
// column n0 + (L >> 4) * 8; .trans gives lane (g, t) stored [2t, 2t+1][g] = B[k 2t, 2t+1][n g].
template <int W>
__device__ __forceinline__ Frag frag_b_kn(int lane) {
  return {swz<W>((((lane >> 3) & 1) << 3) + (lane & 7), (lane >> 4) << 3)};
}

// The address of the lane's row for the 16x16 block at stored (row R, column C) of a tile.
// Bits 4-6 of swz(rl, cl) hold the swizzled chunk (cl/8 ^ (rl & 7), three bits) and bit 7 is 0
// (for W = 64 it is bit 0 of rl*128, but then 2C < 128 has no bit 7 to XOR; for W = 128 the
// row starts at bit 8). So the XOR with 2C splits into an XOR with its bits 5-6 (four distinct
// values per operand, kept in registers) plus an addition of the rest, which folds with R*2W into
// the ldmatrix immediate offset.
template <int W>
__device__ __forceinline__ uint32_t frag_addr(uint32_t tile, Frag f, int R, int C) {
  return tile + uint32_t(R * (2 * W) + ((2 * C) & ~127)) + (f.off ^ uint32_t((2 * C) & 127));
}

// A operand, rows [r0, r0+16), k [k0, k0+16). A stored [m][k]: stored (row r0, col k0).
template <int W>
__device__ __forceinline__ void load_a_mk(uint32_t (&a)[4], uint32_t tile, Frag f, int r0, int k0) {
  ldmatrix_x4(a, frag_addr<W>(tile, f, r0, k0));
}
// A stored [k][m]: stored (row k0, col r0), transposed.
template <int W>
__device__ __forceinline__ void load_a_km(uint32_t (&a)[4], uint32_t tile, Frag f, int r0, int k0) {
  ldmatrix_x4_trans(a, frag_addr<W>(tile, f, k0, r0));
}
// B operand, n [n0, n0+16), k [k0, k0+16). B stored [n][k]: stored (row n0, col k0).
template <int W>
__device__ __forceinline__ void load_b_nk(uint32_t (&b)[4], uint32_t tile, Frag f, int n0, int k0) {
  ldmatrix_x4(b, frag_addr<W>(tile, f, n0, k0));
}
// B stored [k][n]: stored (row k0, col n0), transposed.
template <int W>
__device__ __forceinline__ void load_b_kn(uint32_t (&b)[4], uint32_t tile, Frag f, int n0, int k0) {
  ldmatrix_x4_trans(b, frag_addr<W>(tile, f, k0, n0));
}

// acc[MT][NT] += A[a_r0 .. a_r0 + 16*MT) x [0, KDIM)  *  B[0, KDIM) x [b_n0 .. b_n0 + 8*NT)
// with both operands in swizzled shared tiles. A_KM: A is stored [k][m] (else [m][k]);
// B_KN: B is stored [k][n] (else [n][k]). AW / BW: row widths of the stored tiles.
template <int MT, int NT, int KDIM, bool A_KM, bool B_KN, int AW, int BW>
__device__ __forceinline__ void warp_gemm(float (&acc)[MT][NT][4], uint32_t a_tile, int a_r0, uint32_t b_tile,
                                          int b_n0, int lane) {
  static_assert(NT % 2 == 0 && KDIM % 16 == 0, "whole ldmatrix.x4 tiles");
  const Frag fa = A_KM ? frag_a_km<AW>(lane) : frag_a_mk<AW>(lane);
  const Frag fb = B_KN ? frag_b_kn<BW>(lane) : frag_b_nk<BW>(lane);
#pragma unroll
  for (int k0 = 0; k0 < KDIM; k0 += 16) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      if constexpr (A_KM)
        load_a_km<AW>(a[mt], a_tile, fa, a_r0 + 16 * mt, k0);
      else
        load_a_mk<AW>(a[mt], a_tile, fa, a_r0 + 16 * mt, k0);
    }
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t b[4];
      if constexpr (B_KN)
        load_b_kn<BW>(b, b_tile, fb, b_n0 + 16 * np, k0);
      else
        load_b_nk<BW>(b, b_tile, fb, b_n0 + 16 * np, k0);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma_bf16(acc[mt][2 * np], a[mt], b[0], b[1]);
        mma_bf16(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

template <int MT, int NT>
__device__ __forceinline__ void zero(float (&acc)[MT][NT][4]) {
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
}

}  // namespace primus::cuda::fa
