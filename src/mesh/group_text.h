// How the mesh layer words things in its errors: a c10 error's message without its C++ backtrace, a rank
// list, a group. One home for these (process_group.cpp, world.cpp, rendezvous.cpp, size_agreement.cpp).
#pragma once

#include <c10/util/Exception.h>

#include <exception>
#include <string>
#include <vector>

namespace dtensor::detail {

// c10 errors carry a C++ backtrace in what(); users need the message.
inline std::string message_of(const std::exception& e) {
  if (auto* c10_error = dynamic_cast<const c10::Error*>(&e)) return c10_error->what_without_backtrace();
  return e.what();
}

inline std::string join(const std::vector<int>& v, const char* sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + std::to_string(v[i]);
  return out;
}

// "group [0, 1] (rank 0 of 2)"
inline std::string describe_group(const std::vector<int>& ranks, int group_rank) {
  return "group [" + join(ranks, ", ") + "] (rank " + std::to_string(group_rank) + " of " +
         std::to_string(ranks.size()) + ")";
}

}  // namespace dtensor::detail
