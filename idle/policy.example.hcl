# Caravan idle policy (read by the idle checker; format in domain/idle/policy_file.py).
# Layers: defaults, then the session's resource_group, then its owner's user_policy; later wins per key.
# Durations: seconds, or "30s", "10m", "2h", "1d", "1h30m". 0 turns a limit off.

check_interval = "15s"   # sweep period, also the utilization sampling interval
enabled        = ["session_lifetime", "network_timeout", "utilization"]

defaults {
  max_session_lifetime = "1d"    # counted from RUNNING; BATCH sessions use their batch timeout
  network_idle_timeout = "1h"    # no user traffic for this long; BATCH and INFERENCE are exempt

  utilization {
    grace_period = "10m"         # never reclaimed for low utilization before RUNNING + 10 minutes
    window       = "30m"         # averages over the last 30 minutes of samples
    operator     = "all"         # idle only when every checked metric is below its threshold
    thresholds {                 # percent of what the session was allocated; null = not checked
      cpu_util  = 2
      mem       = null
      cuda_util = 1              # only for sessions with a non-zero cuda.* slot
      cuda_mem  = null
      sim_util  = 1              # Caravan's simulated GPUs (sim.device, sim.shares): the kernel's reported load
    }
  }
}

# GPUs are scarce: reclaim them sooner.
resource_group "gpu" {
  network_idle_timeout = "20m"
  utilization {
    window = "15m"
    thresholds {
      cuda_util = 5
    }
  }
}

# Long experiments: a week of lifetime, no network timeout, utilization still applies.
user_policy "research" {
  max_session_lifetime = "7d"
  network_idle_timeout = 0
}
