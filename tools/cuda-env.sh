# Sourced by tools/deps.sh: finds an installed CUDA toolkit and an NVIDIA driver, installing nothing.
# Sets SLUICE_NVCC to the nvcc to build with (empty when there is none) and defines sluice_has_nvidia_driver.

SLUICE_NVCC=""
if [ -n "${CUDACXX:-}" ] && [ -x "${CUDACXX}" ]; then
    SLUICE_NVCC=$CUDACXX
elif command -v nvcc >/dev/null 2>&1; then
    SLUICE_NVCC=$(command -v nvcc)
else
    for d in /usr/local/cuda /usr/local/cuda-*; do
        if [ -x "$d/bin/nvcc" ]; then SLUICE_NVCC=$d/bin/nvcc; break; fi
    done
fi

# A loaded kernel module, or the driver's user-space library, means a driver is installed.
sluice_has_nvidia_driver() {
    [ -e /proc/driver/nvidia/version ] && return 0
    command -v nvidia-smi >/dev/null 2>&1 && return 0
    ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 ' && return 0
    return 1
}
