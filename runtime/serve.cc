#include "runtime/serve.h"

#include <cstdio>

namespace nsbox::runtime {

int Serve(const ServeOptions&) {
  std::fprintf(stderr, "nsbox serve: not built yet\n");
  return 1;
}

}  // namespace nsbox::runtime
