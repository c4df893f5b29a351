// Moved: generation is not Llama's. The generation runtime is the inference layer beside train/:
// #include "inference/kv_cache.h" (namespace inference; link dtensor_inference). docs/design/layout.md shows the tree.
#pragma once
#error "llama/kv_cache.h moved to inference/kv_cache.h (namespace inference::, library dtensor_inference)"
