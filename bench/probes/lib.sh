# Shared by the probe scripts (source it): bench/kernel_profile.py over a list of configs.
profile_configs() {  # JSON KERNEL SHAPE CONFIG... (env PROFILE_TARGET, default gpu-triton;
                     # PROFILE_ARGS: more kernel_profile flags)
  local json=$1 kernel=$2 shape=$3; shift 3
  local args=(); for c in "$@"; do args+=(--config "$c"); done
  python3 bench/kernel_profile.py --target ${PROFILE_TARGET:-gpu-triton} --kernel $kernel --shape $shape \
    ${PROFILE_ARGS:-} --out $json "${args[@]}"
}
