// "1,64,256" -> {1, 64, 256}: the comma-separated integer lists of the benchmarks' flags.
#pragma once

#include <sstream>
#include <string>
#include <vector>

namespace bench {

inline std::vector<int> ParseIntList(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) v.push_back(std::stoi(x));
  return v;
}

}  // namespace bench
