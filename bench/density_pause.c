/* nsbox-density-pause: the idle process of nsbox-density-floor's sandboxes. Static, so that
 * what it holds is its stack and a few pages of libc's data, as the idle-memory floor measured
 * before nsbox had ("a static pause() init": docs/benchmarks.md, "Baselines measured before
 * nsbox"). */
#include <unistd.h>

int main(void) {
  for (;;) pause();
}
