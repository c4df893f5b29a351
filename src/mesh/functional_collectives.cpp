// Functional collectives over ProcessGroup's raw, equal-size primitives. Uneven sizes are handled by
// padding every rank's piece to the largest (all_gather, reduce_scatter) or by element counts
// (all_to_all), moving the collective's tensor dim to dim 0 so that pieces are contiguous rows.
#include "dtensor/core/error.h"
#include "dtensor/mesh/functional_collectives.h"
#include "dtensor/core/chunking.h"
#include "mesh/uneven_gather.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace dtensor {
namespace {

int64_t normalize_dim(int64_t dim, int64_t ndim, const char* what) {
  int64_t d = dim < 0 ? dim + ndim : dim;
  DTENSOR_CHECK(ndim != 0 && d >= 0 && d < ndim, "dtensor: ", what, " dim ", dim, " is out of range for a ", ndim,
                "-d tensor");
  return d;
}

std::vector<int64_t> offsets_of(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> offsets(sizes.size(), 0);
  for (size_t i = 1; i < sizes.size(); ++i) offsets[i] = offsets[i - 1] + sizes[i - 1];
  return offsets;
}

void check_sizes(const std::vector<int64_t>& sizes, ProcessGroup& group, const char* what) {
  DTENSOR_CHECK(static_cast<int>(sizes.size()) == group.size(), "dtensor: ", what, " got ", sizes.size(),
                " sizes for ", group.describe());
  for (int64_t s : sizes) {
    DTENSOR_CHECK(s >= 0, "dtensor: ", what, " got a negative size");
  }
}

// rows [r * row_block, r * row_block + sizes[r]) of `x` (dim 0) moved into a zero-padded buffer where
// every rank's piece takes `row_block` rows.
at::Tensor pad_rows(const at::Tensor& x, const std::vector<int64_t>& sizes, int64_t row_block) {
  auto shape = x.sizes().vec();
  shape[0] = row_block * static_cast<int64_t>(sizes.size());
  at::Tensor padded = at::zeros(shape, x.options());
  auto offsets = offsets_of(sizes);
  for (size_t r = 0; r < sizes.size(); ++r) {
    if (sizes[r] > 0) padded.narrow(0, r * row_block, sizes[r]).copy_(x.narrow(0, offsets[r], sizes[r]));
  }
  return padded;
}

}  // namespace

std::vector<int64_t> exchange_sizes(int64_t value, ProcessGroup& group) {
  at::Tensor mine = at::full({1}, value, at::kLong);
  at::Tensor all = at::empty({group.size()}, at::kLong);
  group.all_gather_into(all, mine);
  return std::vector<int64_t>(all.data_ptr<int64_t>(), all.data_ptr<int64_t>() + group.size());
}

at::Tensor all_reduce(const at::Tensor& tensor, ReduceOp op, ProcessGroup& group) {
  at::Tensor out = tensor.contiguous().clone();
  if (out.numel() > 0) group.all_reduce_(out, op);
  return out;
}

at::Tensor all_gather(const at::Tensor& tensor, int64_t gather_dim, ProcessGroup& group,
                      std::optional<std::vector<int64_t>> sizes) {
  const int64_t d = normalize_dim(gather_dim, tensor.dim(), "all_gather");
  if (sizes) return detail::all_gather_sized(tensor, d, group, *sizes, /*agreed=*/false);
  const std::vector<int64_t> exchanged = group.exchange_row_counts(tensor.movedim(d, 0));
  return detail::all_gather_sized(tensor, d, group, exchanged, /*agreed=*/true);
}

namespace detail {

at::Tensor all_gather_sized(const at::Tensor& tensor, int64_t d, ProcessGroup& group, const std::vector<int64_t>& sizes,
                            bool agreed) {
  check_sizes(sizes, group, "all_gather");
  DTENSOR_CHECK(sizes[group.rank()] == tensor.size(d), "dtensor: all_gather: this rank's size ", tensor.size(d),
                " along dim ", d, " differs from the size given for it, ", sizes[group.rank()]);
  const int64_t n = group.size();
  const int64_t block = *std::max_element(sizes.begin(), sizes.end());
  const bool even = std::all_of(sizes.begin(), sizes.end(), [&](int64_t s) { return s == block; });

  at::Tensor rows = tensor.movedim(d, 0);
  auto out_shape = rows.sizes().vec();
  out_shape[0] = n * block;
  at::Tensor gathered = at::empty(out_shape, tensor.options());
  at::Tensor in = even ? rows.contiguous() : pad_rows(rows, std::vector<int64_t>{tensor.size(d)}, block);
  if (gathered.numel() > 0) {
    if (agreed) {
      group.all_gather_agreed_into(gathered, in);
    } else {
      group.all_gather_into(gathered, in);
    }
  }
  if (!even) {
    std::vector<at::Tensor> pieces;
    for (int64_t r = 0; r < n; ++r) pieces.push_back(gathered.narrow(0, r * block, sizes[r]));
    gathered = at::cat(pieces, 0);
  }
  return gathered.movedim(0, d).contiguous();
}

}  // namespace detail

at::Tensor reduce_scatter(const at::Tensor& tensor, ReduceOp op, int64_t scatter_dim, ProcessGroup& group,
                          std::optional<std::vector<int64_t>> sizes) {
  int64_t d = normalize_dim(scatter_dim, tensor.dim(), "reduce_scatter");
  const int64_t n = group.size();
  if (!sizes) sizes = chunk_sizes(tensor.size(d), n);
  check_sizes(*sizes, group, "reduce_scatter");
  DTENSOR_CHECK(std::accumulate(sizes->begin(), sizes->end(), int64_t{0}) == tensor.size(d),
                "dtensor: reduce_scatter sizes do not sum to the size of dim ", d);
  const int64_t block = *std::max_element(sizes->begin(), sizes->end());
  const bool even = std::all_of(sizes->begin(), sizes->end(), [&](int64_t s) { return s == block; });

  at::Tensor rows = tensor.movedim(d, 0);
  at::Tensor in = even ? rows.contiguous() : pad_rows(rows, *sizes, block);
  auto out_shape = rows.sizes().vec();
  out_shape[0] = block;
  at::Tensor out = at::empty(out_shape, tensor.options());
  if (in.numel() > 0) group.reduce_scatter_into(out, in, op);
  return out.narrow(0, 0, (*sizes)[group.rank()]).movedim(0, d).contiguous();
}

at::Tensor all_to_all_single(const at::Tensor& tensor, const std::vector<int64_t>& out_splits,
                             const std::vector<int64_t>& in_splits, ProcessGroup& group) {
  check_sizes(out_splits, group, "all_to_all_single");
  check_sizes(in_splits, group, "all_to_all_single");
  DTENSOR_CHECK(tensor.dim() >= 1 && std::accumulate(in_splits.begin(), in_splits.end(), int64_t{0}) == tensor.size(0),
                "dtensor: all_to_all_single: in_splits sum to ",
                std::accumulate(in_splits.begin(), in_splits.end(), int64_t{0}), " rows, the tensor has ",
                tensor.dim() >= 1 ? tensor.size(0) : 0);
  const int64_t row = tensor.dim() >= 1 && tensor.size(0) > 0 ? tensor.numel() / tensor.size(0) : [&] {
    int64_t n = 1;
    for (int64_t d = 1; d < tensor.dim(); ++d) n *= tensor.size(d);
    return n;
  }();
  std::vector<int64_t> in_counts, out_counts;
  for (int64_t x : in_splits) in_counts.push_back(x * row);
  for (int64_t x : out_splits) out_counts.push_back(x * row);
  std::vector<int64_t> shape = tensor.sizes().vec();
  shape[0] = std::accumulate(out_splits.begin(), out_splits.end(), int64_t{0});
  at::Tensor send = tensor.contiguous().view({-1});
  at::Tensor recv = at::empty({shape[0] * row}, tensor.options());
  // Every rank takes part, whatever it sends or receives (it cannot know that the others move nothing).
  group.all_to_all_single(recv, send, out_counts, in_counts);
  return recv.view(shape);
}

at::Tensor all_to_all(const at::Tensor& tensor, int64_t split_dim, int64_t concat_dim, ProcessGroup& group,
                      std::optional<std::vector<int64_t>> concat_sizes,
                      std::optional<std::vector<int64_t>> split_sizes) {
  int64_t s = normalize_dim(split_dim, tensor.dim(), "all_to_all split");
  int64_t c = normalize_dim(concat_dim, tensor.dim(), "all_to_all concat");
  DTENSOR_CHECK(s != c, "dtensor: all_to_all needs different split and concat dims");
  const int64_t n = group.size();
  if (!split_sizes) split_sizes = chunk_sizes(tensor.size(s), n);
  check_sizes(*split_sizes, group, "all_to_all");
  DTENSOR_CHECK(std::accumulate(split_sizes->begin(), split_sizes->end(), int64_t{0}) == tensor.size(s),
                "dtensor: all_to_all split sizes do not sum to the size of dim ", s);
  if (!concat_sizes) concat_sizes = exchange_sizes(tensor.size(c), group);
  check_sizes(*concat_sizes, group, "all_to_all");

  // Piece k (rows split_offsets[k] .. of split dim) goes to rank k, flattened; counts are element counts.
  auto split_offsets = offsets_of(*split_sizes);
  std::vector<at::Tensor> send_pieces;
  std::vector<int64_t> in_counts, out_counts;
  for (int64_t k = 0; k < n; ++k) {
    at::Tensor piece = tensor.narrow(s, split_offsets[k], (*split_sizes)[k]).contiguous().view({-1});
    in_counts.push_back(piece.numel());
    send_pieces.push_back(piece);
  }
  std::vector<std::vector<int64_t>> recv_shapes;
  for (int64_t r = 0; r < n; ++r) {
    auto shape = tensor.sizes().vec();
    shape[s] = (*split_sizes)[group.rank()];
    shape[c] = (*concat_sizes)[r];
    recv_shapes.push_back(shape);
    int64_t numel = 1;
    for (int64_t x : shape) numel *= x;
    out_counts.push_back(numel);
  }
  at::Tensor send = at::cat(send_pieces, 0);
  at::Tensor recv = at::empty({std::accumulate(out_counts.begin(), out_counts.end(), int64_t{0})}, tensor.options());
  // Whether anything moves at all is the same on every rank (all know every rank's sizes); only then may
  // the collective be skipped.
  int64_t other = 1;
  for (int64_t d = 0; d < tensor.dim(); ++d) {
    if (d != s && d != c) other *= tensor.size(d);
  }
  const bool any = other > 0 && tensor.size(s) > 0 &&
                   std::accumulate(concat_sizes->begin(), concat_sizes->end(), int64_t{0}) > 0;
  if (any) group.all_to_all_single(recv, send, out_counts, in_counts);
  std::vector<at::Tensor> pieces;
  int64_t offset = 0;
  for (int64_t r = 0; r < n; ++r) {
    pieces.push_back(recv.narrow(0, offset, out_counts[r]).view(recv_shapes[r]));
    offset += out_counts[r];
  }
  return at::cat(pieces, c);
}

at::Tensor scatter(const at::Tensor& tensor, int64_t dim, int src, ProcessGroup& group, int64_t dim_size,
                   std::optional<std::vector<int64_t>> sizes) {
  int64_t d = normalize_dim(dim, tensor.dim(), "scatter");
  const int64_t n = group.size();
  if (!sizes) sizes = chunk_sizes(dim_size, n);
  check_sizes(*sizes, group, "scatter");
  const bool root = group.rank() == src;
  DTENSOR_CHECK(!root || tensor.size(d) == dim_size, "dtensor: scatter: the source's size along dim ", d, " is ",
                tensor.size(d), ", expected ", dim_size);
  // An all-to-all in which only the source sends: piece k (rows of the dim moved to the front) to rank k.
  at::Tensor rows = tensor.movedim(d, 0);
  int64_t row_numel = 1;
  for (int64_t k = 1; k < rows.dim(); ++k) row_numel *= rows.size(k);
  std::vector<int64_t> in_counts(n, 0), out_counts(n, 0);
  out_counts[src] = (*sizes)[group.rank()] * row_numel;
  at::Tensor send = at::empty({0}, tensor.options());
  if (root) {
    send = rows.contiguous().view({-1});
    for (int64_t k = 0; k < n; ++k) in_counts[k] = (*sizes)[k] * row_numel;
  }
  auto out_shape = rows.sizes().vec();
  out_shape[0] = (*sizes)[group.rank()];
  at::Tensor recv = at::empty({out_counts[src]}, tensor.options());
  if (dim_size * row_numel > 0) group.all_to_all_single(recv, send, out_counts, in_counts);
  return recv.view(out_shape).movedim(0, d).contiguous();
}

at::Tensor broadcast(const at::Tensor& tensor, int src, ProcessGroup& group) {
  at::Tensor out = group.rank() == src ? tensor.contiguous().clone() : at::empty(tensor.sizes(), tensor.options());
  if (out.numel() > 0) group.broadcast_(out, src);
  return out;
}

}  // namespace dtensor
