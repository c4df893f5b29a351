// _StridedShard (placement.h, shard_layout.h, redistribute/strided.h): PyTorch's layout, its runs against a
// reference built from torch.chunk itself, FSDP-over-TP's geometry, and distribute / redistribute /
// full_tensor round trips for the FSDP + TP placements of every Llama weight on a 2x2 ("dp", "tp") mesh.
// The exact shards against PyTorch's own are the oracle's cases (test_oracle.cpp, tags fsdp_tp and strided).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "dtensor/mesh/device_mesh.h"
#include "dtensor/api/dtensor_api.h"
#include "dtensor/tensor/shard_layout.h"
#include "harness/multi_rank.h"

using namespace dtensor;
using namespace dtensor::testing;

namespace {

// PyTorch's _StridedShard._split_tensor on positions 0..size-1, with ATen's chunk: sf torch.chunk pieces
// (missing trailing ones empty), each chunked num_chunks ways, piece `index` of each concatenated.
std::vector<int64_t> reference_split(int64_t size, int64_t sf, int64_t num_chunks, int64_t index) {
  auto chunks = [](const at::Tensor& t, int64_t n) {
    std::vector<at::Tensor> out = t.numel() ? t.chunk(n) : std::vector<at::Tensor>{};
    while (static_cast<int64_t>(out.size()) < n) out.push_back(t.narrow(0, 0, 0));
    return out;
  };
  std::vector<at::Tensor> mine;
  for (const at::Tensor& piece : chunks(at::arange(size, at::kLong), sf)) mine.push_back(chunks(piece, num_chunks)[index]);
  at::Tensor cat = at::cat(mine);
  return std::vector<int64_t>(cat.data_ptr<int64_t>(), cat.data_ptr<int64_t>() + cat.numel());
}

std::vector<int64_t> coordinate_of(int64_t index, const std::vector<int64_t>& shape) {
  std::vector<int64_t> c(shape.size());
  for (size_t k = shape.size(); k-- > 0;) {
    c[k] = index % shape[k];
    index /= shape[k];
  }
  return c;
}

}  // namespace

TEST(StridedShard, RunsAreTorchChunksOfTorchChunks) {
  for (int64_t size = 0; size <= 20; ++size) {
    for (int64_t sf = 1; sf <= 4; ++sf) {
      for (int64_t n = 1; n <= 4; ++n) {
        int64_t covered = 0;
        for (int64_t c = 0; c < n; ++c) {
          const Runs runs = split_runs(size ? Runs{{0, size}} : Runs{}, _StridedShard(0, sf), n, c);
          EXPECT_EQ(run_indices(runs), reference_split(size, sf, n, c)) << size << " sf=" << sf << " n=" << n << " c=" << c;
          covered += run_length(runs);
        }
        EXPECT_EQ(covered, size);
      }
    }
  }
}

// Plain layouts: local_shard's arithmetic (the fast path) and shard_runs (the general one) agree.
TEST(StridedShard, PlainLayoutsAgreeWithRuns) {
  run_ranks(4, [](int rank, int) {
    const DeviceMesh mesh = init_device_mesh("cpu", {2, 2});
    if (rank != 0) return;
    const std::vector<Placement> choices{Shard(0), Shard(1), Replicate(), Partial()};
    for (const auto& shape : std::vector<std::vector<int64_t>>{{5, 3}, {8, 2}, {1, 7}, {0, 4}, {3, 0}}) {
      for (const Placement& a : choices) {
        for (const Placement& b : choices) {
          for (int64_t r = 0; r < 4; ++r) {
            const auto coord = coordinate_of(r, {2, 2});
            const LocalShard box = local_shard(shape, mesh, {a, b}, coord);
            const auto runs = shard_runs(shape, mesh, {a, b}, coord);
            EXPECT_TRUE(box.box);
            for (size_t d = 0; d < shape.size(); ++d) {
              ASSERT_LE(runs[d].size(), 1u);
              EXPECT_EQ(box.shape[d], run_length(runs[d]));
              if (box.shape[d] > 0) EXPECT_EQ(box.offset[d], runs[d][0].start);
            }
          }
        }
      }
    }
  });
}

// FSDP over TP: (_StridedShard(0, sf=tp), Shard(0)) gives rank (i, j) dp-chunk i of tp-chunk j.
TEST(StridedShard, LocalShardIsTheDpChunkOfTheTpChunk) {
  run_ranks(4, [](int rank, int) {
    const DeviceMesh mesh = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
    const Placements p{_StridedShard(0, 2), Shard(0)};
    const int64_t i = rank / 2, j = rank % 2;
    LocalShard s = local_shard({8, 3}, mesh, p, {i, j});
    EXPECT_EQ(s.offset, (std::vector<int64_t>{4 * j + 2 * i, 0}));
    EXPECT_EQ(s.shape, (std::vector<int64_t>{2, 3}));
    EXPECT_TRUE(s.box);
    // Uneven: 6 rows -> tp chunks of 3 -> dp chunks 2 and 1.
    s = local_shard({6, 4}, mesh, p, {i, j});
    EXPECT_EQ(s.offset[0], 3 * j + 2 * i);
    EXPECT_EQ(s.shape[0], i == 0 ? 2 : 1);
    // distribute_tensor (scattered from rank 0 and cut locally) and full_tensor, and the placement's spelling.
    const at::Tensor full = at::arange(48, at::kFloat).reshape({8, 6});
    for (std::optional<int> src : {std::optional<int>(0), std::optional<int>()}) {
      const at::Tensor d = distribute_tensor(full, mesh, p, src);
      EXPECT_TRUE(at::equal(to_local(d), full.narrow(0, 4 * j + 2 * i, 2)));
      EXPECT_TRUE(at::equal(full_tensor(d), full));
    }
    EXPECT_EQ(Placement::parse(p[0].to_string()), p[0]);
    EXPECT_EQ(p[0].to_string(), "_StridedShard(dim=0, sf=2)");
    EXPECT_NE(error_of([] { _StridedShard(0, 0); }).find("split_factor >= 1"), std::string::npos);
  });
}

// A split factor other than the later dims' size is PyTorch's general layout, and its shard need not be
// one box: 7 rows, (_StridedShard(0, sf=3), Shard(0)): pieces {0,1,2} {3,4,5} {6}, dp rank 0 holds rows
// {0, 1, 3, 4, 6}, and tp rank j its torch.chunk j: rank (0, 0) rows {0, 1, 3}, rank (0, 1) rows {4, 6}.
TEST(StridedShard, ShardsThatAreNotOneBoxRoundTrip) {
  run_ranks(4, [](int rank, int) {
    const DeviceMesh mesh = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
    const int64_t i = rank / 2, j = rank % 2;
    for (int64_t rows : {5, 7, 9, 13}) {
      for (int64_t sf : {2, 3, 4}) {
        const Placements p{_StridedShard(0, sf), Shard(0)};
        const at::Tensor full = at::arange(rows * 3, at::kFloat).reshape({rows, 3});
        // The expected rows: PyTorch's split over dp, then torch.chunk over tp.
        const auto dp_rows = reference_split(rows, sf, 2, i);
        const auto tp = chunk_sizes(static_cast<int64_t>(dp_rows.size()), 2);
        std::vector<int64_t> want(dp_rows.begin() + chunk_offset(tp, j), dp_rows.begin() + chunk_offset(tp, j) + tp[j]);
        const at::Tensor d = distribute_tensor(full, mesh, p, std::nullopt);
        EXPECT_TRUE(at::equal(to_local(d), full.index_select(0, at::tensor(want, at::kLong)))) << rows << " sf=" << sf;
        EXPECT_TRUE(at::equal(to_local(distribute_tensor(full, mesh, p, 0)), to_local(d)));
        const LocalShard s = local_shard(dtensor_spec(d));
        EXPECT_EQ(s.shape[0], static_cast<int64_t>(want.size()));
        if (!want.empty()) EXPECT_EQ(s.offset[0], want[0]);
        EXPECT_EQ(s.box, want.empty() || want.back() - want.front() + 1 == static_cast<int64_t>(want.size()));
        EXPECT_TRUE(at::equal(full_tensor(d), full)) << rows << " sf=" << sf;
        // To plain shards and back.
        const at::Tensor plain = redistribute(d, mesh, {Shard(0), Shard(1)});
        EXPECT_TRUE(at::equal(full_tensor(plain), full));
        EXPECT_TRUE(at::equal(to_local(redistribute(plain, mesh, p)), to_local(d)));
      }
    }
  });
}

// The FSDP + TP placements of every weight of the small Llama (hidden 64, 4 heads of 16 with 2 kv heads, ffn
// 128, vocab 256), and of a larger odd one: distribute, full_tensor, and redistribute to and from the
// dp-only, tp-only and replicated layouts, with gradients back through it.
TEST(StridedShard, EveryLlamaWeightRoundTrips) {
  run_ranks(4, [](int, int) {
    const DeviceMesh mesh = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
    const Placements colwise{_StridedShard(0, 2), Shard(0)}, rowwise{Shard(0), Shard(1)}, norm{Shard(0), Replicate()};
    const std::vector<std::pair<std::vector<int64_t>, Placements>> weights{
        {{256, 64}, colwise},  // embed_tokens (Rowwise on an embedding: Shard(0), the vocab), lm_head
        {{64, 64}, colwise},   // q_proj
        {{32, 64}, colwise},   // k_proj, v_proj
        {{128, 64}, colwise},  // gate_proj, up_proj
        {{64, 64}, rowwise},   // o_proj
        {{64, 128}, rowwise},  // down_proj
        {{64}, norm},          // input/post_attention_layernorm, norm
        {{100, 24}, colwise},  // uneven rows: tp chunks of 50 -> dp chunks of 25
    };
    uint64_t seed = 7;
    for (const auto& [shape, p] : weights) {
      const at::Tensor full = seeded_randn(seed++, shape);
      const at::Tensor leaf = distribute_tensor(full, mesh, p).set_requires_grad(true);
      EXPECT_TRUE(at::equal(full_tensor(leaf), full)) << to_string(p);
      for (const Placements& other : {Placements{Replicate(), Replicate()}, Placements{Shard(0), Replicate()},
                                      Placements{Replicate(), Shard(0)}, Placements{Shard(0), Shard(0)}}) {
        const at::Tensor moved = redistribute(leaf, mesh, other);
        EXPECT_TRUE(at::equal(to_local(moved), to_local(distribute_tensor(full, mesh, other)))) << to_string(other);
        EXPECT_TRUE(at::equal(to_local(redistribute(moved, mesh, p)), to_local(leaf).detach())) << to_string(p);
      }
      // The gradient of full_tensor is the shard of the upstream gradient, in the same layout.
      const at::Tensor g = seeded_randn(seed++, shape);
      (full_tensor(leaf) * g).sum().backward();
      ASSERT_TRUE(leaf.grad().defined());
      EXPECT_TRUE(at::allclose(full_tensor(leaf.grad()), g)) << to_string(p);
    }
  });
}
