// Tests for the server options: defaults, JSON file then flag overrides, errors that name the
// offending flag or key, options that cannot apply to a device, --help groups and exit codes.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "server/server_config.h"

namespace llm {
namespace {

namespace fs = std::filesystem;

class TempConfigFile {
 public:
  explicit TempConfigFile(const std::string& text) {
    std::random_device rd;
    path_ = fs::temp_directory_path() / ("llm_test_server_config_" + std::to_string(getpid()) +
                                         "_" + std::to_string(rd()) + ".json");
    std::ofstream out(path_, std::ios::trunc);
    out << text;
  }
  ~TempConfigFile() {
    std::error_code ec;
    fs::remove(path_, ec);
  }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
};

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST_CASE("ServerConfig defaults", "[server_config]") {
  const ServerConfig defaults;
  CHECK(defaults.listen_address == "127.0.0.1:50051");  // loopback unless configured

  // Only model_dir given: everything else keeps its default, and only model_dir is explicit.
  auto c = ParseServerConfig({"--model-dir", "/models/tiny"});
  REQUIRE(c.ok());
  CHECK(c->explicit_keys == std::set<std::string>{"model_dir"});
  CHECK(c->engine.model.model_dir == "/models/tiny");
  for (const ServerOption& o : ServerOptions()) {
    INFO(o.key());
    if (o.key() != "model_dir") CHECK(o.Get(*c) == o.Get(defaults));
  }
  // The defaults themselves are valid values: each one parses back through its option.
  for (const ServerOption& o : ServerOptions()) {
    INFO(o.key());
    ServerConfig copy;
    CHECK(o.Set(copy, o.Get(defaults)).ok());
  }
  CHECK(defaults.engine.default_max_tokens <= defaults.engine.max_tokens_limit);
  CHECK(defaults.engine.scheduler.max_batched_tokens == 512);
  CHECK(defaults.engine.model.kv_cache_bytes == 256u << 20);
  CHECK(defaults.engine.model.tensor_parallel_size == 1);
  auto split = ParseServerConfig({"--model-dir", "/m", "--tensor-parallel-size", "4"});
  REQUIRE(split.ok());
  CHECK(split->engine.model.tensor_parallel_size == 4);
}

TEST_CASE("ServerConfig options are unique and well formed", "[server_config]") {
  std::set<std::string> keys;
  for (const ServerOption& o : ServerOptions()) {
    INFO(o.key());
    CHECK(keys.insert(o.key()).second);
    if (!o.alias().empty()) CHECK(keys.insert(o.alias()).second);
    CHECK_FALSE(o.help().empty());
    CHECK(o.flag().rfind("--", 0) == 0);
    CHECK(o.flag().find('_') == std::string::npos);
  }
}

TEST_CASE("ServerConfig JSON file then flags override", "[server_config]") {
  TempConfigFile file(R"({"model_dir": "/from/file", "max_num_seqs": 16, "block_size": 32,
                         "listen_address": "0.0.0.0:6000", "log_level": "debug"})");
  // The file applies first even when --config comes after a flag.
  auto c = ParseServerConfig(
      {"--max-num-seqs", "8", "--config", file.path(), "--max_batched_tokens=512"});
  REQUIRE(c.ok());
  const EngineConfig& e = c->engine;
  CHECK(e.scheduler.max_num_seqs == 8);      // flag beats file
  CHECK(e.model.block_size == 32);           // file
  CHECK(e.model.model_dir == "/from/file");  // file
  CHECK(c->listen_address == "0.0.0.0:6000");
  CHECK(c->log_level == "debug");
  CHECK(e.scheduler.max_batched_tokens == 512);  // --key=value form with underscores
  CHECK(e.model.cuda_graph_max_batch == 256);    // default: graphs on up to 256 sequences
  CHECK(e.model.cuda_graph_warmup);              // captured at start-up
  CHECK(e.model.mla_kernel == "auto");
  CHECK(e.model.c8_prefill == "auto");
  // Explicit: what the file and the flags set, nothing else.
  CHECK(c->explicit_keys == std::set<std::string>{"model_dir", "max_num_seqs", "block_size",
                                                  "listen_address", "log_level",
                                                  "max_batched_tokens"});

  auto c2 = ParseServerConfig({"--config", file.path(), "--model", "/from/flag", "--device", "cuda",
                               "--cuda-graph-max-batch", "0", "--cuda-graph-warmup", "false",
                               "--kv-cache-memory-mb", "64"});
  REQUIRE_FALSE(c2.ok());  // kv_cache_memory_mb does not size the CUDA pool
  CHECK(Contains(c2.status().message(), "--kv-cache-memory-mb"));
  CHECK(Contains(c2.status().message(), "cuda"));

  auto c3 = ParseServerConfig({"--config", file.path(), "--model", "/from/flag", "--device", "cuda",
                               "--cuda-graph-max-batch", "0", "--cuda-graph-warmup", "false",
                               "--mla-kernel", "portable", "--c8-prefill", "fmha",
                               "--gpu-memory-percent", "50"});
  REQUIRE(c3.ok());
  CHECK(c3->engine.model.model_dir == "/from/flag");  // --model is short for --model-dir
  CHECK(c3->engine.scheduler.max_num_seqs == 16);
  CHECK(c3->engine.model.cuda_graph_max_batch == 0);  // graphs off
  CHECK_FALSE(c3->engine.model.cuda_graph_warmup);
  CHECK(c3->engine.model.mla_kernel == "portable");
  CHECK(c3->engine.model.c8_prefill == "fmha");
  CHECK(c3->engine.model.gpu_memory_fraction == 0.5);
  CHECK(c3->engine.model.fp8_fast_accumulation);        // the default
  CHECK(c3->engine.model.fp8_static_attention_output);  // the default

  auto c4 = ParseServerConfig({"--config", file.path(), "--device", "cuda", "--weight-dtype", "fp8",
                               "--kv-cache-dtype", "int8", "--fp8-fast-accumulation", "false",
                               "--fp8-static-attention-output", "false"});
  REQUIRE(c4.ok());
  CHECK(c4->engine.model.weight_dtype == "fp8");
  CHECK_FALSE(c4->engine.model.fp8_fast_accumulation);
  CHECK_FALSE(c4->engine.model.fp8_static_attention_output);

  auto c5 = ParseServerConfig({"--model", "/m", "--kv-cache-memory-mb", "64"});
  REQUIRE(c5.ok());
  CHECK(c5->engine.model.kv_cache_bytes == 64u << 20);
}

TEST_CASE("ServerConfig rejects bad values naming the flag", "[server_config]") {
  struct Case {
    std::vector<std::string> args;
    std::string names;
  };
  const Case cases[] = {
      {{"--max-num-seqs", "0"}, "--max-num-seqs"},
      {{"--block-size", "abc"}, "--block-size must be an integer, got 'abc'"},
      {{"--block-size", "16x"}, "--block-size"},
      {{"--max-batched-tokens", "99999999999999"}, "--max-batched-tokens"},
      {{"--cuda-graph-max-batch", "-1"}, "--cuda-graph-max-batch"},
      {{"--log-level", "loud"}, "--log-level must be one of trace"},
      {{"--listen-address", "localhost"}, "--listen-address must be host:port"},
      {{"--metrics-address", "9400"}, "--metrics-address"},
      {{"--mla-kernel", "fast"}, "--mla-kernel must be one of auto, wgmma, portable, got 'fast'"},
      {{"--c8-prefill", "tensor"}, "--c8-prefill must be one of auto, tiles, fmha, got 'tensor'"},
      {{"--device", "tpu"}, "--device must be one of cpu, cuda, auto, got 'tpu'"},
      {{"--tensor-parallel-size", "3"}, "--tensor-parallel-size must be 1, 2, 4 or 8, got '3'"},
      {{"--tensor-parallel-size", "16"}, "--tensor-parallel-size"},
      {{"--kv-cache-dtype", "int4"}, "--kv-cache-dtype"},
      {{"--enable-prefix-caching", "yes"}, "--enable-prefix-caching must be true or false"},
      {{"--max-tokens-limit", "100", "--default-max-tokens", "200"}, "--default-max-tokens"},
  };
  for (const Case& k : cases) {
    std::vector<std::string> args = {"--model-dir", "/m"};
    args.insert(args.end(), k.args.begin(), k.args.end());
    INFO(k.names);
    auto c = ParseServerConfig(args);
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().code() == StatusCode::kInvalidArgument);
    CHECK(Contains(c.status().message(), k.names));
  }
  SECTION("bad value in the JSON file names the file and key") {
    TempConfigFile file(R"({"model_dir": "/m", "max_num_seqs": 0})");
    auto c = ParseServerConfig({"--config", file.path()});
    REQUIRE_FALSE(c.ok());
    CHECK(Contains(c.status().message(), file.path() + ": max_num_seqs must be in"));
  }
  SECTION("JSON values of the wrong type") {
    for (const char* text : {R"({"model_dir": "/m", "max_num_seqs": "16"})",
                             R"({"model_dir": "/m", "overlap_steps": 1})", R"({"model_dir": 3})"}) {
      TempConfigFile file(text);
      auto c = ParseServerConfig({"--config", file.path()});
      INFO(text);
      REQUIRE_FALSE(c.ok());
      CHECK(Contains(c.status().message(), file.path()));
    }
  }
}

TEST_CASE("ServerConfig refuses explicit options that cannot apply", "[server_config]") {
  struct Case {
    std::vector<std::string> args;
    std::string names;
  };
  const Case cases[] = {
      // CUDA-only options on the cpu (the default device).
      {{"--dummy-weights", "true"}, "--dummy-weights does not apply to device cpu"},
      {{"--weight-dtype", "fp8"}, "--weight-dtype does not apply to device cpu"},
      {{"--weight-dtype", "auto"}, "--weight-dtype does not apply to device cpu"},
      {{"--moe-weight-dtype", "mxfp4"}, "--moe-weight-dtype does not apply to device cpu"},
      {{"--moe-activation-dtype", "fp8"}, "--moe-activation-dtype does not apply to device cpu"},
      {{"--cuda-graph-max-batch", "8"}, "--cuda-graph-max-batch"},
      {{"--cuda-graph-warmup", "true"}, "--cuda-graph-warmup"},
      {{"--gpu-memory-percent", "50"}, "--gpu-memory-percent"},
      {{"--mla-kernel", "portable"}, "--mla-kernel"},
      {{"--c8-prefill", "tiles"}, "--c8-prefill"},
      {{"--prefill-attention-backend", "none"}, "--prefill-attention-backend"},
      {{"--device", "cpu", "--fp8-fast-accumulation", "true"}, "--fp8-fast-accumulation"},
      // The CUDA KV pool is sized by gpu_memory_percent.
      {{"--device", "cuda", "--kv-cache-memory-mb", "256"},
       "--kv-cache-memory-mb does not apply to device cuda"},
      // Settings that need another setting.
      {{"--device", "cuda", "--fp8-fast-accumulation", "false"},
       "--fp8-fast-accumulation applies only with --weight-dtype fp8"},
      {{"--device", "cuda", "--weight-dtype", "fp8", "--fp8-static-attention-output", "false"},
       "--fp8-static-attention-output applies only with"},
      {{"--kv-scale-granularity", "per_channel"}, "--kv-scale-granularity applies only with"},
      {{"--kv-scales-file", "/s.json"}, "--kv-scales-file applies only with"},
  };
  for (const Case& k : cases) {
    std::vector<std::string> args = {"--model-dir", "/m"};
    args.insert(args.end(), k.args.begin(), k.args.end());
    INFO(k.names);
    auto c = ParseServerConfig(args);
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().code() == StatusCode::kInvalidArgument);
    CHECK(Contains(c.status().message(), k.names));
  }
  // Defaults never count: a cpu config leaves every CUDA option alone and parses.
  CHECK(ParseServerConfig({"--model-dir", "/m"}).ok());
  CHECK(ParseServerConfig({"--model-dir", "/m", "--device", "cuda"}).ok());
  CHECK(ParseServerConfig({"--model-dir", "/m", "--kv-cache-dtype", "int8",
                           "--kv-scale-granularity", "per_channel"})
            .ok());
  // With device auto the check waits for the device (the server runs it once resolved).
  auto c = ParseServerConfig({"--model-dir", "/m", "--device", "auto", "--kv-cache-memory-mb", "64",
                              "--cuda-graph-warmup", "false"});
  REQUIRE(c.ok());
  CHECK(Contains(CheckOptionsApply(*c, "cuda").message(), "--kv-cache-memory-mb"));
  CHECK(Contains(CheckOptionsApply(*c, "cpu").message(), "--cuda-graph-warmup"));
}

TEST_CASE("ServerConfig rejects unknown flags and keys naming them", "[server_config]") {
  SECTION("unknown flag") {
    auto c = ParseServerConfig({"--model-dir", "/m", "--bogus", "1"});
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().code() == StatusCode::kInvalidArgument);
    CHECK(Contains(c.status().message(), "unknown flag --bogus"));
  }
  SECTION("removed option") {
    auto c = ParseServerConfig({"--model-dir", "/m", "--fused-decode-append", "true"});
    REQUIRE_FALSE(c.ok());
    CHECK(Contains(c.status().message(), "--fused-decode-append"));
  }
  SECTION("unknown JSON key") {
    TempConfigFile file(R"({"model_dir": "/m", "turbo": 1})");
    auto c = ParseServerConfig({"--config", file.path()});
    REQUIRE_FALSE(c.ok());
    CHECK(Contains(c.status().message(), "unknown key 'turbo'"));
  }
  SECTION("a flag alias is not a JSON key") {
    TempConfigFile file(R"({"model": "/m"})");
    auto c = ParseServerConfig({"--config", file.path()});
    REQUIRE_FALSE(c.ok());
    CHECK(Contains(c.status().message(), "'model'"));
  }
  SECTION("positional argument") {
    auto c = ParseServerConfig({"--model-dir", "/m", "stray"});
    REQUIRE_FALSE(c.ok());
    CHECK(Contains(c.status().message(), "stray"));
  }
  SECTION("flag without a value") {
    auto c = ParseServerConfig({"--model-dir", "/m", "--max-num-seqs"});
    REQUIRE_FALSE(c.ok());
    CHECK(Contains(c.status().message(), "--max-num-seqs"));
  }
  SECTION("missing config file") {
    auto c = ParseServerConfig({"--config", "/nonexistent/dir/server.json"});
    REQUIRE_FALSE(c.ok());
    CHECK(Contains(c.status().message(), "/nonexistent/dir/server.json"));
  }
  SECTION("config file that is not a JSON object") {
    TempConfigFile file("[1, 2]");
    auto c = ParseServerConfig({"--config", file.path()});
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().code() == StatusCode::kInvalidArgument);
  }
}

TEST_CASE("ServerConfig requires model_dir", "[server_config]") {
  auto c = ParseServerConfig({});
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().code() == StatusCode::kInvalidArgument);
  CHECK(Contains(c.status().message(), "model_dir"));
  auto c2 = ParseServerConfig({"--max-num-seqs", "4"});
  REQUIRE_FALSE(c2.ok());
  CHECK(Contains(c2.status().message(), "model_dir"));
}

TEST_CASE("Command line: --help, --help-all, --version exit 0, errors exit 2", "[server_config]") {
  for (const char* flag : {"--help", "-h"}) {
    // Even with other (valid or invalid) arguments around it.
    CommandLine cl = ParseCommandLine({"--model-dir", "/m", flag, "--bogus", "1"});
    CHECK_FALSE(cl.config);
    CHECK(cl.exit_code == 0);
    CHECK(cl.err.empty());
    CHECK(cl.out == ServerUsage(false));
  }
  const std::string help = ServerUsage(false), all = ServerUsage(true);
  CHECK(Contains(help, "usage: llm-server"));
  CHECK(Contains(all, "usage: llm-server"));
  // --help lists every option but the kernel experiments; --help-all lists every one.
  for (const ServerOption& o : ServerOptions()) {
    INFO(o.key());
    CHECK(Contains(all, o.flag() + " "));
    CHECK(Contains(help, o.flag() + " ") == (o.group() != OptionGroup::kKernel));
  }
  CHECK(Contains(help, "--max-num-seqs INT"));
  CHECK(Contains(help, "(default 64)"));
  CHECK(Contains(help, "--model, --model-dir STR"));
  CHECK(Contains(help, "--device cpu|cuda|auto"));
  CHECK_FALSE(Contains(help, "--mla-kernel"));
  CHECK(Contains(all, "--mla-kernel auto|wgmma|portable"));
  CHECK(Contains(all, OptionGroupTitle(OptionGroup::kKernel)));
  for (const std::string& text : {help, all}) {
    size_t start = 0;
    while (start < text.size()) {
      const size_t end = text.find('\n', start);
      CHECK(end - start <= 100);  // wrapped for a terminal
      start = end + 1;
    }
  }

  CommandLine ha = ParseCommandLine({"--help-all"});
  CHECK(ha.exit_code == 0);
  CHECK(ha.out == all);

  CommandLine v = ParseCommandLine({"--version"});
  CHECK_FALSE(v.config);
  CHECK(v.exit_code == 0);
  CHECK(v.out.rfind("llm-server ", 0) == 0);
  CHECK_FALSE(Contains(v.out, "unknown"));

  CommandLine bad = ParseCommandLine({"--model-dir", "/m", "--bogus", "1"});
  CHECK_FALSE(bad.config);
  CHECK(bad.exit_code == 2);
  CHECK(bad.out.empty());
  CHECK(Contains(bad.err, "--bogus"));
  CommandLine bad2 = ParseCommandLine({"--model-dir", "/m", "--max-num-seqs", "x"});
  CHECK(bad2.exit_code == 2);
  CHECK(Contains(bad2.err, "--max-num-seqs"));

  CommandLine ok = ParseCommandLine({"--model-dir", "/m"});
  REQUIRE(ok.config);
  CHECK(ok.out.empty());
  CHECK(ok.err.empty());
}

TEST_CASE("Every shipped server config parses", "[server_config]") {
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(LLM_CONFIGS_DIR)) {
    if (e.path().extension() != ".json") continue;
    ++files;
    INFO(e.path().string());
    auto c = ParseServerConfig({"--config", e.path().string()});
    INFO(c.status().ToString());
    REQUIRE(c.ok());
    CHECK_FALSE(c->engine.model.model_dir.empty());
  }
  CHECK(files >= 2);  // server.json and the CUDA Llama-3-8B example
}

}  // namespace
}  // namespace llm

namespace llm {
namespace {

TEST_CASE("speculative decoding options", "[server_config][speculative]") {
  auto on = ParseServerConfig({"--model-dir", "/m", "--speculative-method", "ngram",
                               "--num-speculative-tokens", "4", "--ngram-prompt-lookup-min", "2",
                               "--ngram-prompt-lookup-max", "5"});
  REQUIRE(on.ok());
  CHECK(on->engine.speculative.method == "ngram");
  CHECK(on->engine.speculative.num_speculative_tokens == 4);
  CHECK(on->engine.speculative.ngram_prompt_lookup_min == 2);
  CHECK(on->engine.speculative.ngram_prompt_lookup_max == 5);
  CHECK_FALSE(ServerConfig().engine.speculative.enabled());  // off unless named
  auto draft = ParseServerConfig(
      {"--model-dir", "/m", "--speculative-method", "draft", "--speculative-model", "/d"});
  REQUIRE(draft.ok());
  CHECK(draft->engine.speculative.method == "draft");
  CHECK(draft->engine.speculative.draft_model_dir == "/d");

  struct Bad {
    std::vector<std::string> args;
    std::string message;
  };
  for (const Bad& b : std::vector<Bad>{
           {{"--speculative-method", "draft"}, "needs the draft model's directory"},
           {{"--speculative-model", "/d"}, "--speculative-method draft"},
           {{"--speculative-method", "ngram", "--speculative-model", "/d"},
            "--speculative-method draft"},
           {{"--speculative-method", "eagle"}, "must be one of none, ngram, draft, mtp"},
           {{"--speculative-method", "ngram", "--num-speculative-tokens", "5"},
            "--num-speculative-tokens"},
           {{"--speculative-method", "ngram", "--num-speculative-tokens", "0"},
            "--num-speculative-tokens"},
           {{"--num-speculative-tokens", "2"}, "--speculative-method ngram"},
           {{"--ngram-prompt-lookup-max", "3"}, "--speculative-method ngram"},
           {{"--speculative-method", "ngram", "--ngram-prompt-lookup-min", "4",
             "--ngram-prompt-lookup-max", "2"},
            "1 <= min <= max"},
       }) {
    std::vector<std::string> args = {"--model-dir", "/m"};
    args.insert(args.end(), b.args.begin(), b.args.end());
    auto c = ParseServerConfig(args);
    INFO(b.message);
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().message().find(b.message) != std::string::npos);
  }
}

}  // namespace
}  // namespace llm
