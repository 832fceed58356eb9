# Sourced by the A/B scripts (fp8-loop-ab.sh, host-ab.sh): a base tree beside
# this one, and the 90a configure both are built with.
#
# ab_base_tree DEST: DEST becomes this tree (build folders, wheels and the
# BASE folder left out) with the files of $BASE over it: BASE holds the base
# tree's versions of the files that differ, at their repository paths (e.g.
# made by `git show <rev>:<path>`).
ab_base_tree() {
  local base_files="${BASE:?set BASE to the folder of the base files}" dest="$1"
  rm -rf "$dest" && mkdir -p "$dest"
  tar --exclude='./build-*' --exclude="./$base_files" --exclude=./.whl -cf - . | tar -xf - -C "$dest"
  cp -r "$base_files"/. "$dest"/
}

# ab_conf SRC BUILD [cmake args...]: a Release build of SRC in BUILD for sm_90a,
# with the Python extension.
ab_conf() {
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DGATEDMLP_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)" "${@:3}"
}
