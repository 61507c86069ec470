"""The names of the metrics reaper exports: the sections (reaper/metrics/sections/)
write them, the clients (reaper/metrics/client.py: reaper stats, reaper top) read
them. Family names, as the collector yields them: a counter's samples are NAME_total
(total()), a histogram's NAME_bucket, NAME_sum and NAME_count.

Imports nothing: a client and PID 1 may both load it for free.
"""


def total(name: str) -> str:
    """A counter's sample name."""
    return name + "_total"


# identity (sections/identity.py)
BUILD_INFO = "reaper_build_info"
START_TIME_SECONDS = "reaper_start_time_seconds"
PID = "reaper_pid"
PID_NAMESPACE = "reaper_pid_namespace"
METRICS_LISTENING = "reaper_metrics_listening"
SOURCE_AVAILABLE = "reaper_source_available"        # the collector's own (collector.py)
# main child (sections/main_child.py)
MAIN_CHILD_STATE = "reaper_main_child_state"
MAIN_CHILD_UP = "reaper_main_child_up"
MAIN_CHILD_PID = "reaper_main_child_pid"
STOP_REQUESTED = "reaper_stop_requested"
MAIN_CHILD_EXIT_CODE = "reaper_main_child_exit_code"
MAIN_CHILD_OUTCOME = "reaper_main_child_outcome"
PHASE = "reaper_phase"
# services (sections/services.py)
SERVICE_UP = "reaper_service_up"
SERVICE_PID = "reaper_service_pid"
SERVICE_READY = "reaper_service_ready"
SERVICE_STARTS = "reaper_service_starts"
SERVICE_FAILED = "reaper_service_failed"
SERVICE_STATE = "reaper_service_state"
SERVICE_LAST_EXIT_CODE = "reaper_service_last_exit_code"
SERVICE_START_TIME_SECONDS = "reaper_service_start_time_seconds"
SERVICE_READY_FLOODS = "reaper_service_ready_floods"
# reaping (sections/reaping.py)
REAPED = "reaper_reaped"
REAPED_CPU_SECONDS = "reaper_reaped_cpu_seconds"
REAP_LATENCY_SECONDS = "reaper_reap_latency_seconds"
# signals (sections/signals.py)
SIGNALS_RECEIVED = "reaper_signals_received"
SIGNALS_FORWARDED = "reaper_signals_forwarded"
# drain (sections/drain.py)
DRAIN_PROCESSES = "reaper_drain_processes"
DRAIN_DURATION_SECONDS = "reaper_drain_duration_seconds"
# errors (sections/errors.py)
POLICY_ERRORS = "reaper_policy_errors"
POLICY_RESTARTS = "reaper_policy_restarts"
LOG_LINES_DROPPED = "reaper_log_lines_dropped"
# processes in scope (sections/scope.py)
ZOMBIES = "reaper_zombies"
ZOMBIE_OLDEST_AGE_SECONDS = "reaper_zombie_oldest_age_seconds"
ZOMBIES_BY_PARENT = "reaper_zombies_by_parent"
PROCESSES = "reaper_processes"
# budgets (sections/budget.py)
STRAY_CPU_SECONDS = "reaper_stray_cpu_seconds"
BUDGET_VIOLATIONS = "reaper_budget_violations"
BUDGET_ACTIONS = "reaper_budget_actions"
BUDGET_SAMPLES = "reaper_budget_samples"
STRAY_CGROUP_ESCAPES = "reaper_stray_cgroup_escapes"
BUDGET_STALE_CGROUPS_REMOVED = "reaper_budget_stale_cgroups_removed"
STRAYS_OVER_BUDGET = "reaper_strays_over_budget"
BUDGET_CGROUPS = "reaper_budget_cgroups"
BUDGET_INFO = "reaper_budget_info"
STRAY_CPU_CORES = "reaper_stray_cpu_cores"
STRAY_MEMORY_BYTES = "reaper_stray_memory_bytes"
# reaper's own usage (sections/self_usage.py)
CPU_SECONDS = "reaper_cpu_seconds"
RESIDENT_MEMORY_BYTES = "reaper_resident_memory_bytes"
# node CPU (sections/node_cpu.py)
NODE_CPU_BUSIEST_RATIO = "reaper_node_cpu_busiest_ratio"
NODE_CPUS = "reaper_node_cpus"
NODE_CPU_SATURATED_CORES = "reaper_node_cpu_saturated_cores"
NODE_CPU_ANY_SATURATED_SECONDS = "reaper_node_cpu_any_saturated_seconds"
NODE_CPU_BUSIEST_SATURATED_SECONDS = "reaper_node_cpu_busiest_saturated_seconds"
NODE_CPU_MODE_RATIO = "reaper_node_cpu_mode_ratio"
NODE_CPU_BUSY_RATIO = "reaper_node_cpu_busy_ratio"
NODE_CPU_SATURATED_SECONDS = "reaper_node_cpu_saturated_seconds"
# cgroups (sections/node_cgroups.py, sections/cgroup_pids.py)
NODE_CGROUPS = "reaper_node_cgroups"
NODE_MEMORY_CGROUPS_AVAILABLE = "reaper_node_memory_cgroups_available"
CGROUP_V2_DESCENDANTS = "reaper_cgroup_v2_descendants"
CGROUP_V2_CONTROLLER_CGROUPS = "reaper_cgroup_v2_controller_cgroups"
VISIBLE_MEMORY_CGROUPS = "reaper_visible_memory_cgroups"
CGROUP_PIDS_AVAILABLE = "reaper_cgroup_pids_available"
CGROUP_PIDS = "reaper_cgroup_pids"
CGROUP_PIDS_MAX = "reaper_cgroup_pids_max"
# reaper node's (reaper/node/collector.py writes them; reaper top reads them)
NODE_ZOMBIES = "reaper_node_zombies"
NODE_ZOMBIES_BY_CGROUP = "reaper_node_zombies_by_cgroup"
NODE_CPU_SATURATION_STREAK_SECONDS = "reaper_node_cpu_saturation_streak_seconds"
NODE_CPU_SATURATION_STREAK_MAX_SECONDS = "reaper_node_cpu_saturation_streak_max_seconds"
NODE_CPU_SATURATION_STREAK_LENGTH_SECONDS = "reaper_node_cpu_saturation_streak_length_seconds"
# leftovers (sections/leftovers.py)
LEFTOVERS = "reaper_leftovers"
LEFTOVER_OWNERS_ENDED = "reaper_leftover_owners_ended"
LEFTOVER_DEVICE_HOLDERS = "reaper_leftover_device_holders"
LEFTOVER_GPU_MEMORY_BYTES = "reaper_leftover_gpu_memory_bytes"
LEFTOVERS_TRACKED = "reaper_leftovers_tracked"
