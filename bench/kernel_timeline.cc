// CUPTI activity tracing for model_step_bench --kernel-timeline (bench/kernel_timeline.h).
#include "bench/kernel_timeline.h"

#include "bench/kernel_timeline_table.h"

#include <cupti.h>
#include <cxxabi.h>

#include <cstdlib>
#include <mutex>
#include <utility>
#include <vector>

namespace bench {
namespace {

constexpr size_t kBufferBytes = 8 << 20;

std::mutex g_mu;
std::vector<TimedKernel> g_kernels;  // every kernel record CUPTI has delivered
uint64_t g_begin = 0, g_end = 0;

// The demangled name without its parameter list ("ns::Kernel<3, true>").
std::string ShortName(const char* mangled) {
  if (mangled == nullptr) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string n = status == 0 && d != nullptr ? d : mangled;
  std::free(d);
  int depth = 0;
  for (size_t i = 0; i < n.size(); ++i) {
    if (n[i] == '<') ++depth;
    if (n[i] == '>') --depth;
    if (n[i] == '(' && depth == 0) return n.substr(0, i);
  }
  return n;
}

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* r = nullptr;
  std::vector<TimedKernel> got;
  while (cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) {
    if (r->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(r);
    got.push_back(TimedKernel{k->start, k->end, ShortName(k->name)});
  }
  std::free(buffer);
  const std::lock_guard<std::mutex> lock(g_mu);
  g_kernels.insert(g_kernels.end(), got.begin(), got.end());
}

uint64_t Now() {
  uint64_t t = 0;
  cuptiGetTimestamp(&t);
  return t;
}

}  // namespace

bool KernelTimeline::Start(std::string* error) {
  CUptiResult r = cuptiActivityRegisterCallbacks(BufferRequested, BufferCompleted);
  if (r == CUPTI_SUCCESS) r = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  if (r != CUPTI_SUCCESS) {
    const char* s = nullptr;
    cuptiGetResultString(r, &s);
    *error = std::string("CUPTI: ") + (s ? s : "unknown error");
    return false;
  }
  return true;
}

void KernelTimeline::BeginWindow() {
  g_begin = Now();
}
void KernelTimeline::EndWindow() {
  g_end = Now();
}

std::string KernelTimeline::Report(int steps, int positions) {
  cuptiActivityFlushAll(1);
  std::vector<TimedKernel> w;
  {
    const std::lock_guard<std::mutex> lock(g_mu);
    for (const TimedKernel& k : g_kernels) {
      if (k.start >= g_begin && k.start <= g_end) w.push_back(k);
    }
  }
  return TabulateKernelTimeline(std::move(w), steps, positions);
}

}  // namespace bench
