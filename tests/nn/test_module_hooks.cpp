// The hook mechanism (module_hooks.h) on its own: what passes through hooks untouched (non-tensor inputs,
// tuple and list outputs), and the hook table's lifetime and concurrency.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <new>
#include <thread>

#include "dtensor/nn/layers.h"
#include "dtensor/nn/module_hooks.h"
#include "dtensor/tp/parallelize.h"
#include "dtensor/api/dtensor_api.h"
#include "harness/multi_rank.h"

using namespace dtensor;
using dtensor::testing::error_of;
using dtensor::testing::run_ranks;
using dtensor::testing::seeded_randn;

namespace {

// forward(x, times, negate, mask = None) -> (y, 2 y) with y = +-x * times (* mask): a tuple output, an int,
// a bool and an optional tensor input.
struct TwoOutImpl : torch::nn::Module {
  std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& x, int64_t times, bool negate,
                                             const std::optional<at::Tensor>& mask = std::nullopt) {
    return nn::call_with_hooks<std::tuple<at::Tensor, at::Tensor>>(
        *this, {x, times, negate, mask}, {}, [](const nn::Args& a, const nn::KwArgs&) {
          at::Tensor y = a[0].toTensor() * a[1].toInt();
          if (a[2].toBool()) y = -y;
          if (!a[3].isNone()) y = y * a[3].toTensor();
          return std::make_tuple(y, y * 2);
        });
  }
};

// The same as a list output.
struct ListOutImpl : torch::nn::Module {
  std::vector<at::Tensor> forward(const at::Tensor& x) {
    return nn::call_with_hooks<std::vector<at::Tensor>>(*this, {x}, {}, [](const nn::Args& a, const nn::KwArgs&) {
      const at::Tensor& t = a[0].toTensor();
      return std::vector<at::Tensor>{t + 1, t - 1};
    });
  }
};

}  // namespace

TEST(ModuleHooks, NonTensorInputsAndTupleOutputsPassThroughAStyle) {
  run_ranks(2, [](int rank, int) {
    auto mesh = init_device_mesh("cpu", {2});
    auto module = std::make_shared<TwoOutImpl>();
    // x arrives as this rank's Shard(0) piece and is gathered; times, negate and mask have no layout.
    // Output 0 (plain, replicated) leaves as this rank's Shard(0) piece; output 1 is not touched.
    parallelize_module(*module, mesh,
                       PrepareModuleInputOutput({.input_layouts = {Shard(0), std::nullopt, std::nullopt, std::nullopt},
                                                 .desired_input_layouts = {Replicate(), std::nullopt, std::nullopt, std::nullopt},
                                                 .use_local_input = true,
                                                 .output_layouts = {Replicate(), std::nullopt},
                                                 .desired_output_layouts = {Shard(0), std::nullopt}}));
    at::Tensor x = seeded_randn(1, {4, 3}), mask = seeded_randn(2, {4, 3});
    for (bool with_mask : {false, true}) {
      auto [y0, y1] = module->forward(x.chunk(2, 0)[rank], 3, true,
                                      with_mask ? std::optional<at::Tensor>(mask) : std::nullopt);
      at::Tensor y = with_mask ? -x * 3 * mask : -x * 3;
      EXPECT_FALSE(is_dtensor(y0));
      EXPECT_TRUE(at::allclose(y0, y.chunk(2, 0)[rank]));
      EXPECT_TRUE(at::allclose(y1, y * 2));  // untouched: the whole value, plain
    }
    // A layout on an input that is not a tensor is refused, as in PyTorch.
    auto wrong = std::make_shared<TwoOutImpl>();
    parallelize_module(*wrong, mesh,
                       PrepareModuleInput({.input_layouts = {std::nullopt, Replicate(), std::nullopt, std::nullopt},
                                           .desired_input_layouts = {std::nullopt, Replicate(), std::nullopt, std::nullopt}}));
    std::string e = error_of([&] { wrong->forward(x, 3, false); });
    EXPECT_NE(e.find("PrepareModuleInput for '': input 1 has a layout but is a Int, not a tensor"), std::string::npos) << e;
  });
}

TEST(ModuleHooks, PrepareModuleOutputTakesOneLayoutPerListElement) {
  run_ranks(2, [](int rank, int) {
    auto mesh = init_device_mesh("cpu", {2});
    auto module = std::make_shared<ListOutImpl>();
    parallelize_module(*module, mesh,
                       PrepareModuleOutput({.output_layouts = {std::nullopt, Replicate()},
                                            .desired_output_layouts = {std::nullopt, Shard(1)}}));
    at::Tensor x = seeded_randn(3, {2, 4});
    auto out = module->forward(x);
    ASSERT_EQ(out.size(), 2u);
    EXPECT_TRUE(at::allclose(out[0], x + 1));
    EXPECT_TRUE(at::allclose(out[1], (x - 1).chunk(2, 1)[rank]));
    // One output but two layouts: PyTorch's error.
    auto single = nn::Linear(4, 4);
    parallelize_module(*single, mesh, PrepareModuleOutput({.output_layouts = {Replicate(), Replicate()},
                                                           .desired_output_layouts = {Replicate(), Replicate()}}));
    std::string e = error_of([&] { single(x); });
    EXPECT_NE(e.find("the module gave 1 outputs but output_layouts has 2"), std::string::npos) << e;
  });
}

TEST(ModuleHooks, TensorOnlyHooksAndGeneralHooksRunInRegistrationOrder) {
  auto module = std::make_shared<TwoOutImpl>();
  nn::register_forward_pre_hook(*module, nn::ForwardPreHook([](torch::nn::Module&, nn::Args args, nn::KwArgs kwargs) {
    args[1] = args[1].toInt() + 1;  // times 2 -> 3
    return std::make_pair(std::move(args), std::move(kwargs));
  }));
  nn::register_forward_hook(*module, nn::ForwardHook([](torch::nn::Module&, const nn::Args& args, c10::IValue out) {
    EXPECT_EQ(args[1].toInt(), 3);  // hooks after forward see the inputs forward saw
    auto elements = out.toTupleRef().elements().vec();
    return c10::IValue(c10::ivalue::Tuple::create(elements[1], elements[0]));  // swapped
  }));
  at::Tensor x = seeded_randn(4, {3});
  auto [a, b] = module->forward(x, 2, false);
  EXPECT_TRUE(at::allclose(a, x * 6));
  EXPECT_TRUE(at::allclose(b, x * 3));
  // A tensor-only hook on a forward with an int input is an error naming the module, not a silent drop.
  auto other = std::make_shared<TwoOutImpl>();
  nn::register_forward_pre_hook(*other, nn::TensorForwardPreHook([](torch::nn::Module&, nn::Tensors xs) { return xs; }));
  std::string e = error_of([&] { other->forward(x, 2, false); });
  EXPECT_NE(e.find("got input 1 of type Int"), std::string::npos) << e;
}

TEST(ModuleHooks, ADestroyedModulesEntryIsGone) {
  const size_t before = nn::prune_hook_table();
  {
    nn::Linear linear(4, 4);
    nn::register_forward_hook(*linear, nn::TensorForwardHook([](torch::nn::Module&, const nn::Tensors&, at::Tensor y) { return y; }));
    nn::set_module_path(*linear, "linear");
    EXPECT_EQ(nn::prune_hook_table(), before + 1);
  }
  EXPECT_EQ(nn::prune_hook_table(), before);
}

TEST(ModuleHooks, ANewModuleAtADeadModulesAddressHasNoHooks) {
  // Two modules in turn at one address: placement new into one buffer, each owned by its own shared_ptr
  // (its own control block, as with shared_ptr<T>(new T)).
  alignas(nn::LinearImpl) static unsigned char buffer[sizeof(nn::LinearImpl)];
  auto make = [] {
    return std::shared_ptr<nn::LinearImpl>(new (buffer) nn::LinearImpl(4, 4), [](nn::LinearImpl* p) { p->~LinearImpl(); });
  };
  at::Tensor x = seeded_randn(5, {2, 4});
  auto first = make();
  nn::register_forward_hook(*first, nn::TensorForwardHook([](torch::nn::Module&, const nn::Tensors&, at::Tensor y) { return y * 0; }));
  EXPECT_TRUE(nn::has_hooks(*first));
  EXPECT_TRUE(at::equal(first->forward(x), at::zeros({2, 4})));
  first.reset();
  auto second = make();
  ASSERT_EQ(static_cast<void*>(second.get()), static_cast<void*>(buffer));
  EXPECT_FALSE(nn::has_hooks(*second));
  EXPECT_TRUE(at::allclose(second->forward(x), at::linear(x, second->weight, second->bias)));
}

TEST(ModuleHooks, ConcurrentHookedForwardsWhileTheTableChanges) {
  // Threads run hooked forwards of one shared module and of their own, while another thread keeps
  // changing the table (hooking and dropping modules). Every result is the hooked one.
  nn::Linear shared(8, 8);
  nn::register_forward_pre_hook(*shared, nn::TensorForwardPreHook([](torch::nn::Module&, nn::Tensors xs) {
    xs[0] = xs[0] + 1;
    return xs;
  }));
  nn::register_forward_hook(*shared, nn::TensorForwardHook([](torch::nn::Module&, const nn::Tensors&, at::Tensor y) { return y * 2; }));
  at::Tensor x = seeded_randn(6, {4, 8});
  at::Tensor expected = at::linear(x + 1, shared->weight, shared->bias).detach() * 2;
  std::atomic<bool> stop{false};
  std::atomic<int> wrong{0};
  std::thread writer([&] {
    for (int k = 0; k < 200 && !stop; ++k) {
      nn::Linear scratch(2, 2);
      nn::register_forward_hook(*scratch, nn::TensorForwardHook([](torch::nn::Module&, const nn::Tensors&, at::Tensor y) { return y; }));
    }
  });
  std::vector<std::thread> readers;
  for (int t = 0; t < 6; ++t) {
    readers.emplace_back([&, t] {
      at::NoGradGuard no_grad;
      nn::Linear own(8, 8);
      nn::register_forward_hook(*own, nn::TensorForwardHook([t](torch::nn::Module&, const nn::Tensors&, at::Tensor y) { return y + t; }));
      at::Tensor own_expected = at::linear(x, own->weight, own->bias) + t;
      for (int k = 0; k < 300; ++k) {
        if (!at::allclose(shared(x), expected) || !at::allclose(own(x), own_expected)) ++wrong;
      }
    });
  }
  for (auto& r : readers) r.join();
  stop = true;
  writer.join();
  EXPECT_EQ(wrong.load(), 0);
}
