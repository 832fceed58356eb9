// A test's environment variable, set for a scope: the library reads its
// knobs (GATEDMLP_FORCE_PATH, GATEDMLP_FP8_PROMOTE, ...) when it plans a
// call, so a test sets one around the calls it is about. No CUDA: the CPU
// suites use it too.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

namespace gatedmlp::test {

// Sets (value) or unsets (nullptr) an environment variable for a scope and
// restores what was there before.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = std::string(old);
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) setenv(name_.c_str(), old_->c_str(), 1);
    else unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

}  // namespace gatedmlp::test
