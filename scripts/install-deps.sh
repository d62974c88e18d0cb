#!/usr/bin/env bash
# Installs the Debian packages ds4 builds against, only those that are missing.
set -euo pipefail
# clang and libclang-rt-dev (libFuzzer, ASan, UBSan runtimes): fuzz/run.sh and its CTest entry.
pkgs=(cmake g++ make ninja-build doctest-dev libbenchmark-dev libboost-dev nlohmann-json3-dev libcli11-dev clang libclang-rt-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "ds4: installing ${missing[*]}"
  sudo_cmd=(); [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}"
fi
