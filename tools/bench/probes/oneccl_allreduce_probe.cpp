// Probe, not built by CMake: oneCCL's all_reduce between two processes on one host, for the comparison in
// docs/design/same_host_collectives.md. The KVS address goes through a file here; a backend would pass it
// through our store. Build and run (PyPI wheels; `oneccl-cpu` 2022.2.0 lacks the libccl.so.2 its libccl.so
// needs, which only the big `oneccl` wheel ships; libfabric from Debian's libfabric1):
//   pip download --no-deps oneccl-cpu oneccl-devel oneccl==2022.2.0   # unzip; copy libccl.so.2* beside libccl.so
//   g++ -O2 -std=c++17 oneccl_allreduce_probe.cpp -I$DEVEL/include -L$CPU/lib -lccl -Wl,-rpath,$CPU/lib -o probe
//   CCL_ATL_TRANSPORT=ofi CCL_ATL_SHM=1 FI_PROVIDER=shm ./probe 0 & ./probe 1
#include <oneapi/ccl.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>
#include <vector>
#include <algorithm>
#include <unistd.h>
int main(int argc, char** argv) {
  int rank = atoi(argv[1]), size = 2;
  const char* path = "/tmp/cclb/kvs.addr";
  ccl::init();
  ccl::shared_ptr_class<ccl::kvs> kvs;
  if (rank == 0) {
    kvs = ccl::create_main_kvs();
    auto a = kvs->get_address();
    std::ofstream(std::string(path) + ".tmp", std::ios::binary).write(a.data(), a.size());
    rename((std::string(path) + ".tmp").c_str(), path);
  } else {
    ccl::kvs::address_type a;
    for (int i = 0; i < 1000; ++i) { std::ifstream f(path, std::ios::binary); if (f && f.read(a.data(), a.size())) break; usleep(10000); }
    kvs = ccl::create_kvs(a);
  }
  auto comm = ccl::create_communicator(size, rank, kvs);
  for (size_t bytes : {size_t(1024), size_t(1 << 20), size_t(64) << 20}) {
    size_t n = bytes / 4; std::vector<float> buf(n, 1.f);
    int iters = bytes >= (64u << 20) ? 10 : 200;
    for (int i = 0; i < 3; ++i) ccl::allreduce(buf.data(), buf.data(), n, ccl::reduction::sum, comm).wait();
    std::vector<double> t;
    for (int i = 0; i < iters; ++i) {
      auto s = std::chrono::steady_clock::now();
      ccl::allreduce(buf.data(), buf.data(), n, ccl::reduction::sum, comm).wait();
      t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - s).count());
    }
    std::sort(t.begin(), t.end());
    if (rank == 0) printf("oneccl all_reduce %10zu B  median %10.1f us  busbw %.2f GB/s\n", bytes, t[t.size()/2], bytes / t[t.size()/2] / 1e3);
  }
  if (rank == 0) unlink(path);
  return 0;
}
