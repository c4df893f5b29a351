// Moved: generation is not Llama's. The generation runtime is the inference layer beside train/:
// #include "inference/generate.h" (namespace inference; link dtensor_inference). docs/design/layout.md shows the tree.
#pragma once
#error "llama/generate.h moved to inference/generate.h (namespace inference::, library dtensor_inference)"
