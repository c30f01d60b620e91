/* nsbox-density-pause: the idle process of nsbox-density-floor's sandboxes. Static, so that
 * what it holds is its stack and a few pages of libc's data, as the research's floor had
 * ("a static idle init", ../shared/research/perf-baselines.md §4.6). */
#include <unistd.h>

int main(void) {
  for (;;) pause();
}
