# Shared by scripts/demo.sh and scripts/test.sh: make a virtual environment and install dippm-nas into it.
# usage: make_venv DIR TORCH_PINS EXTRAS
make_venv() {
    local dir="$1" torch_pins="$2" extras="$3"
    local py
    py="$(command -v python3.11 || command -v python3)"
    if [ ! -x "$dir/bin/python" ]; then
        echo "== creating $dir with $py"
        "$py" -m venv "$dir"
    fi
    # torch first, pinned: on these machines the pinned builds come from local disk; an unpinned
    # torch would pull a multi-GB CUDA build.
    echo "== installing $torch_pins"
    # shellcheck disable=SC2086
    "$dir/bin/python" -m pip install -q $torch_pins
    echo "== installing dippm-nas[$extras]"
    "$dir/bin/python" -m pip install -q -e ".[$extras]"
}
