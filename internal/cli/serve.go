package cli

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/spacesandbox/space/internal/server"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// serveFlag binds one `space serve` flag to its SPACE_* variable.
type serveFlag struct {
	name, env, usage string
	str              *string
	num              *int
}

func (a *app) serveCommand() *cobra.Command {
	var cfg server.Config
	flags := []serveFlag{
		{name: "database", env: "SPACE_DATABASE", usage: "Postgres database of the records, postgres://USER:PASSWORD@HOST/DB (default: the SQLite file space.db under --data)", str: &cfg.Database},
		{name: "cache", env: "SPACE_CACHE", usage: "cache directory: gVisor build, template builds (default /var/cache/space)", str: &cfg.CacheDir},
		{name: "listen", env: "SPACE_LISTEN", usage: "address to listen on (default 127.0.0.1:7070)", str: &cfg.Listen},
		{name: "driver", env: "SPACE_DRIVER", usage: "sandbox driver (default gvisor)", str: &cfg.Driver},
		{name: "drivers", env: "SPACE_DRIVERS", usage: "drivers to enable, e.g. gvisor,qemu (default: the --driver)", str: &cfg.Drivers},
		{name: "runsc", env: "SPACE_RUNSC", usage: "path to runsc (default: the cached build)", str: &cfg.RunscPath},
		{name: "firecracker", env: "SPACE_FIRECRACKER", usage: "path to firecracker (default: PATH; driver firecracker)", str: &cfg.FirecrackerPath},
		{name: "jailer", env: "SPACE_JAILER", usage: "path to Firecracker's jailer (default: PATH); none runs firecracker unjailed, for development only", str: &cfg.JailerPath},
		{name: "firecracker-uid", env: "SPACE_FIRECRACKER_UID", usage: "uid and gid jailed Firecracker VMs run as (default 65534)", num: &cfg.FirecrackerUID},
		{name: "agent", env: "SPACE_AGENT", usage: "path to space-agent (default: next to the space binary)", str: &cfg.AgentPath},
		{name: "template", env: "SPACE_TEMPLATE", usage: "default template (default base)", str: &cfg.DefaultTemplate},
		{name: "log-level", env: "SPACE_LOG_LEVEL", usage: "debug|info|warn|error (default info)", str: &cfg.LogLevel},
		{name: "log-format", env: "SPACE_LOG_FORMAT", usage: "text|json (default text)", str: &cfg.LogFormat},
		{name: "default-timeout", env: "SPACE_DEFAULT_TIMEOUT", usage: "sandbox timeout in seconds when a create asks for none (default 300)", num: &cfg.DefaultTimeoutS},
		{name: "max-timeout", env: "SPACE_MAX_TIMEOUT", usage: "largest sandbox timeout in seconds (default 86400)", num: &cfg.MaxTimeoutS},
		{name: "pool-size", env: "SPACE_POOL_SIZE", usage: "warm sandboxes of the default template kept ready; -1 turns the pool off (default 2)", num: &cfg.PoolSize},
		{name: "pool-drivers", env: "SPACE_POOL_DRIVERS", usage: "warm pools on more drivers, DRIVER=N[:MEMORY_MB[:CPUS]],… e.g. qemu=2 (needs the driver in --drivers; QEMU pools refill by restoring a post-boot checkpoint; an entry for the default driver replaces --pool-size)", str: &cfg.PoolDrivers},
		{name: "pools", env: "SPACE_POOLS", usage: "warm pools of any template, TEMPLATE[@DRIVER]=N[:MEMORY_MB[:CPUS]],… e.g. python-data=2,base@qemu=1:512,python-data=1::2 (N::CPUS sets the CPUs alone; a template's pool starts once it is built; an entry replaces --pool-size or --pool-drivers for its template and driver)", str: &cfg.Pools},
		{name: "team-max-sandboxes", env: "SPACE_TEAM_MAX_SANDBOXES", usage: "sandboxes a team may hold at once, running or paused, unless it has a quota of its own (default 0: no limit)", num: &cfg.TeamMaxSandboxes},
		{name: "team-max-memory-mb", env: "SPACE_TEAM_MAX_MEMORY_MB", usage: "memory in MiB a team's sandboxes may hold together, unless it has a quota of its own (default 0: no limit)", num: &cfg.TeamMaxMemoryMB},
		{name: "team-max-cpu", env: "SPACE_TEAM_MAX_CPU", usage: "CPUs a team's sandboxes may hold together, unless it has a quota of its own (default 0: no limit)", num: &cfg.TeamMaxCPU},
		{name: "team-max-rps", env: "SPACE_TEAM_MAX_RPS", usage: "API requests per second a team may send (a second's worth at once; sandbox port traffic not counted), unless it has a quota of its own (default 0: no limit)", num: &cfg.TeamMaxRPS},
		{name: "team-max-disk-mb", env: "SPACE_TEAM_MAX_DISK_MB", usage: "host disk in MiB a team's sandboxes may reserve together (the sum of their disk_mb, 10240 each by default), unless it has a quota of its own (default 0: no limit)", num: &cfg.TeamMaxDiskMB},
		{name: "team-max-snapshot-mb", env: "SPACE_TEAM_MAX_SNAPSHOT_MB", usage: "data in MiB a team's snapshots may hold, unless it has a quota of its own (default 0: no limit)", num: &cfg.TeamMaxSnapshotMB},
		{name: "reserve-disk-mb", env: "SPACE_RESERVE_DISK_MB", usage: "free disk kept under --data: below it creates and snapshots are refused and pools wait (default 5% of the filesystem, 512-10240; -1 off)", num: &cfg.ReserveDiskMB},
		{name: "reserve-memory-mb", env: "SPACE_RESERVE_MEMORY_MB", usage: "host memory kept free: below it creates are refused and pools wait (default 5% of the host, 256-2048; -1 off)", num: &cfg.ReserveMemoryMB},
		{name: "snapshot-interval", env: "SPACE_SNAPSHOT_INTERVAL", usage: "seconds between automatic files snapshots of a changing sandbox; -1 turns them off (default 300)", num: &cfg.SnapshotIntervalS},
		{name: "retention-days", env: "SPACE_RETENTION_DAYS", usage: "how long snapshot history is kept, thinned hourly then daily (default 7)", num: &cfg.RetentionDays},
		{name: "egress-hosts", env: "SPACE_EGRESS_HOSTS", usage: "operator name map for the egress proxy, name=ip,… (off by default; for tests and internal mirrors)", str: &cfg.EgressHosts},
		{name: "egress-allow-cidr", env: "SPACE_EGRESS_ALLOW_CIDR", usage: "private ranges the egress proxy may reach, CIDR,… (off by default)", str: &cfg.EgressAllowCIDR},
		{name: "egress-root-ca", env: "SPACE_EGRESS_ROOT_CA", usage: "PEM file of extra root CAs for upstream TLS (off by default)", str: &cfg.EgressRootCA},
		{name: "e2b-listen", env: "SPACE_E2B_LISTEN", usage: "address of the E2B-compatible API (control plane and envd on one port; off by default)", str: &cfg.E2BListen}, // E2B facade (internal/e2b)
		{name: "e2b-domain", env: "SPACE_E2B_DOMAIN", usage: "domain the E2B API names sandboxes under (<port>-<id>.<domain>, a wildcard DNS name and TLS in front of --e2b-listen); unset, SDKs need E2B_SANDBOX_URL", str: &cfg.E2BDomain},
		{name: "metrics-listen", env: "SPACE_METRICS_LISTEN", usage: "address serving /metrics for Prometheus instead of the API listener (default: the API listener; set it when the API is reachable by tenants)", str: &cfg.MetricsListen},
		{name: "debug-listen", env: "SPACE_DEBUG_LISTEN", usage: "loopback address serving Go pprof profiles under /debug/pprof/ (off by default)", str: &cfg.DebugListen},
		{name: "checkpoint-on-pause", env: "SPACE_CHECKPOINT_ON_PAUSE", usage: "record a checkpoint in the timeline on every pause: on|off (default on)", str: &cfg.CheckpointOnPause},
		{name: "snapshot-on-exec", env: "SPACE_SNAPSHOT_ON_EXEC", usage: "a files snapshot after every command that changed files, for sandboxes created without snapshot_on_exec: on|off (default off)", str: &cfg.SnapshotOnExec},
		{name: "qemu-cgroups", env: "SPACE_QEMU_CGROUPS", usage: "put each QEMU VM in its own cgroup (CPU, memory, pids limits): on|off (default on; off only for hosts without a cgroup filesystem)", str: &cfg.QEMUCgroups},
	}
	cmd := &cobra.Command{
		Use:   "serve [flags]",
		Short: "Run the space server",
		Long: "Run the space server until SIGINT or SIGTERM. Every flag can also be set with\n" +
			"the SPACE_* variable named in its help; a flag wins over its variable.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.DataDir = firstNonEmpty(a.dataDir, a.getenv("SPACE_DATA"))
			if err := applyServeEnv(cmd.Flags(), flags, a.getenv); err != nil {
				return err
			}
			if _, err := server.ParsePoolDrivers(cfg.PoolDrivers); err != nil {
				return err
			}
			if _, err := server.ParsePools(cfg.Pools); err != nil {
				return err
			}
			cfg.Defaults()
			if err := cfg.Validate(); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			// The first signal starts the shutdown; a second one ends the
			// process at once (the default action once no longer caught).
			context.AfterFunc(ctx, stop)
			return server.Run(ctx, cfg)
		},
	}
	for _, f := range flags {
		usage := f.usage + " (env " + f.env + ")"
		if f.str != nil {
			cmd.Flags().StringVar(f.str, f.name, "", usage)
		} else {
			cmd.Flags().IntVar(f.num, f.name, 0, usage)
		}
	}
	return cmd
}

// applyServeEnv fills every flag not given on the command line from its
// environment variable.
func applyServeEnv(fs *pflag.FlagSet, flags []serveFlag, getenv func(string) string) error {
	for _, f := range flags {
		v := getenv(f.env)
		if fs.Changed(f.name) || v == "" {
			continue
		}
		if f.str != nil {
			*f.str = v
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("%s=%q: want a number of seconds", f.env, v)
		}
		*f.num = n
	}
	return nil
}
