// bench/kernel_timeline_table.h
#include "bench/kernel_timeline_table.h"

#include <algorithm>
#include <cstdio>
#include <map>

namespace bench {

std::string TabulateKernelTimeline(std::vector<TimedKernel> w, int steps, int positions) {
  std::sort(w.begin(), w.end(),
            [](const TimedKernel& a, const TimedKernel& b) { return a.start < b.start; });
  char line[512];
  if (steps < 1 || w.empty() || w.size() % steps != 0) {
    std::snprintf(line, sizeof(line),
                  "kernel timeline: %zu kernels in the window do not split into %d steps\n",
                  w.size(), steps);
    return line;
  }
  const size_t K = w.size() / steps;
  for (int s = 1; s < steps; ++s) {
    for (size_t i = 0; i < K; ++i) {
      if (w[s * K + i].name != w[i].name) {
        std::snprintf(line, sizeof(line),
                      "kernel timeline: step %d's kernel %zu is %s, step 0's is %s: not one "
                      "sequence\n",
                      s, i, w[s * K + i].name.c_str(), w[i].name.c_str());
        return line;
      }
    }
  }
  // Per position: mean start offset from the step's first start, duration, end increment.
  std::vector<double> offset(K, 0), dur(K, 0), inc(K, 0);
  double span = 0;
  for (int s = 0; s < steps; ++s) {
    const TimedKernel* k = &w[s * K];
    uint64_t last_end = k[0].start;  // the first kernel's increment is its duration
    for (size_t i = 0; i < K; ++i) {
      offset[i] += (k[i].start - k[0].start) / 1e3;
      dur[i] += (k[i].end - k[i].start) / 1e3;
      const uint64_t end = std::max(k[i].end, last_end);
      inc[i] += (end - last_end) / 1e3;
      last_end = end;
    }
    span += (last_end - k[0].start) / 1e3;
  }
  for (size_t i = 0; i < K; ++i) {
    offset[i] /= steps;
    dur[i] /= steps;
    inc[i] /= steps;
  }
  span /= steps;
  struct Sum {
    int count = 0;
    double dur = 0, inc = 0;
  };
  std::map<std::string, Sum> by_name;
  for (size_t i = 0; i < K; ++i) {
    Sum& s = by_name[w[i].name];
    ++s.count;
    s.dur += dur[i];
    s.inc += inc[i];
  }
  std::vector<std::pair<std::string, Sum>> rows(by_name.begin(), by_name.end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.inc > b.second.inc; });
  std::string out;
  std::snprintf(line, sizeof(line),
                "kernel timeline (CUPTI, %d steps): %zu kernels a step, first start to last end "
                "%.1f us\n| kernel | per step | us each (start to end) | end increments, us a "
                "step | share |\n|---|---|---|---|---|\n",
                steps, K, span);
  out += line;
  for (const auto& [name, s] : rows) {
    std::snprintf(line, sizeof(line), "| %.120s | %d | %.2f | %.1f | %.1f%% |\n", name.c_str(),
                  s.count, s.dur / s.count, s.inc, 100.0 * s.inc / span);
    out += line;
  }
  out +=
      "| # | kernel | start offset us | us (start to end) | end increment us |\n|---|---|---|---|"
      "---|\n";
  for (size_t i = 0; i < std::min(K, static_cast<size_t>(positions)); ++i) {
    std::snprintf(line, sizeof(line), "| %zu | %.120s | %.1f | %.2f | %.2f |\n", i,
                  w[i].name.c_str(), offset[i], dur[i], inc[i]);
    out += line;
  }
  return out;
}

}  // namespace bench
