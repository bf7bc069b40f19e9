#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "cuda/pack_kernels.h"

namespace fluxmpi {

namespace {

// Each block converts one chunk of one span; a span of n elements has ceil(n / kChunk) chunks.
constexpr std::int64_t kChunk = 8192;
constexpr int kThreads = 256;

// One row of the device table: a span and the index of its first chunk among all chunks.
struct Row {
  const void* src;
  void* dst;
  std::int64_t numel;
  double scale;
  std::int64_t first_chunk;
};

template <typename Src, typename Dst>
__global__ void copy_spans_kernel(const Row* rows, int nrows) {
  const std::int64_t chunk = blockIdx.x;
  // The span that holds this chunk: the last row whose first_chunk <= chunk (binary search in
  // a table of at most a few thousand rows, read through the cache).
  int lo = 0, hi = nrows - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (rows[mid].first_chunk <= chunk) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const Row r = rows[lo];
  using Op = at::opmath_type<Src>;
  const Op k = static_cast<Op>(r.scale);
  const auto* s = static_cast<const Src*>(r.src);
  auto* d = static_cast<Dst*>(r.dst);
  const std::int64_t begin = (chunk - r.first_chunk) * kChunk;
  const std::int64_t end = min(begin + kChunk, r.numel);
  // Scalar loads: offsets inside a bucket need not be aligned for vector loads.
  for (std::int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) {
    d[j] = static_cast<Dst>(static_cast<Op>(s[j]) * k);
  }
}

}  // namespace

void launch_copy_spans(const std::vector<CopySpan>& spans, c10::ScalarType from, c10::ScalarType to,
                       c10::Device device) {
  std::vector<Row> rows;
  rows.reserve(spans.size());
  std::int64_t chunks = 0;
  // A plain copy of a non-float dtype moves bytes, so one instantiation serves every dtype.
  const bool bytes = from == to && !at::isFloatingType(from);
  const auto esz = static_cast<std::int64_t>(c10::elementSize(from));
  for (const auto& s : spans) {
    const std::int64_t n = bytes ? s.numel * esz : s.numel;
    if (n == 0 || (s.src == s.dst && s.scale == 1.0 && from == to)) continue;
    TORCH_CHECK(bytes || s.scale == 1.0 || at::isFloatingType(from),
                "launch_copy_spans: scaling needs a floating dtype");
    rows.push_back({s.src, s.dst, n, s.scale, chunks});
    chunks += (n + kChunk - 1) / kChunk;
  }
  if (rows.empty()) return;
  TORCH_CHECK(chunks <= std::numeric_limits<int>::max(), "launch_copy_spans: ", chunks,
              " chunks exceed one launch's grid");
  c10::cuda::CUDAGuard guard(device);
  auto stream = c10::cuda::getCurrentCUDAStream(device.index());
  // The table: pinned host memory, copied on the stream (torch's caching host allocator keeps
  // the pinned block until that copy is done), then read by the kernel on the same stream.
  const auto table_bytes = static_cast<std::int64_t>(rows.size() * sizeof(Row));
  auto host = at::empty({table_bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  std::memcpy(host.data_ptr(), rows.data(), static_cast<std::size_t>(table_bytes));
  auto table = host.to(at::TensorOptions().device(device), /*non_blocking=*/true);
  const auto* dev_rows = static_cast<const Row*>(table.const_data_ptr());
  const int nrows = static_cast<int>(rows.size());
  const dim3 grid(static_cast<unsigned>(chunks));
  if (bytes) {
    copy_spans_kernel<std::uint8_t, std::uint8_t><<<grid, kThreads, 0, stream>>>(dev_rows, nrows);
  } else {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, from, "copy_spans", [&] {
      using Src = scalar_t;
      AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, to, "copy_spans", [&] {
        copy_spans_kernel<Src, scalar_t><<<grid, kThreads, 0, stream>>>(dev_rows, nrows);
      });
    });
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace fluxmpi
