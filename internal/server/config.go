package server

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
	"github.com/spacesandbox/space/internal/template"
)

// Config is everything `space serve` is told by flags and SPACE_* variables.
type Config struct {
	DataDir string // SPACE_DATA, --data: database, keys, sandbox state (default /var/lib/space)
	// Database is where the records live: a postgres:// URL (SPACE_DATABASE,
	// --database), or empty for the SQLite file space.db in DataDir.
	Database        string
	CacheDir        string // SPACE_CACHE, --cache: gVisor build, template builds (default /var/cache/space)
	Listen          string // SPACE_LISTEN, --listen (default 127.0.0.1:7070)
	Driver          string // SPACE_DRIVER, --driver: the default driver (default "gvisor")
	Drivers         string // SPACE_DRIVERS, --drivers: every driver to enable, comma-separated (default: the default driver)
	RunscPath       string // SPACE_RUNSC, --runsc: path to runsc (default: the cached build)
	FirecrackerPath string // SPACE_FIRECRACKER, --firecracker: path to firecracker (default: PATH)
	JailerPath      string // SPACE_JAILER, --jailer: its jailer (default: PATH); "none" runs firecracker unjailed (development only)
	FirecrackerUID  int    // SPACE_FIRECRACKER_UID, --firecracker-uid: uid and gid of jailed VMs (default 65534)
	AgentPath       string // SPACE_AGENT, --agent: path to space-agent (default: next to the space binary)
	DefaultTemplate string // SPACE_TEMPLATE, --template (default "base")
	LogLevel        string // SPACE_LOG_LEVEL, --log-level: debug|info|warn|error (default info)
	LogFormat       string // SPACE_LOG_FORMAT, --log-format: text|json (default text)
	// MaxTimeoutS caps a sandbox's timeout; DefaultTimeoutS applies when a
	// create asks for none.
	DefaultTimeoutS int // --default-timeout (default 300)
	MaxTimeoutS     int // --max-timeout (default 86400)
	// PoolSize is how many warm sandboxes of the default template are kept
	// started ahead of demand (--pool-size; 0 is the default, 2; -1 turns
	// it off).
	PoolSize int
	// PoolDrivers keeps warm pools of the default template on other
	// drivers too: "qemu=2" or "qemu=2:256" (size, and memory in MiB),
	// comma-separated (--pool-drivers, SPACE_POOL_DRIVERS; see
	// ParsePoolDrivers). An entry for the default driver replaces
	// --pool-size for it.
	PoolDrivers string
	// Pools keeps warm pools of any template: "python-data=2" or
	// "base@qemu=1:512" (TEMPLATE[@DRIVER]=N[:MEMORY_MB[:CPUS]], comma-separated;
	// --pools, SPACE_POOLS; see ParsePools). An entry replaces what
	// --pool-size and --pool-drivers say for the same template and driver.
	Pools string
	// Admission. A team without a quota of its own (PUT
	// /v1/teams/{team}/quota) gets these; 0 is no limit.
	TeamMaxSandboxes  int // --team-max-sandboxes: sandboxes held at once, running or paused (default 0: none)
	TeamMaxMemoryMB   int // --team-max-memory-mb: the sum of their memory (default 0: none)
	TeamMaxCPU        int // --team-max-cpu: the sum of their CPUs (default 0: none)
	TeamMaxRPS        int // --team-max-rps: API requests per second (default 0: none)
	TeamMaxSnapshotMB int // --team-max-snapshot-mb: data its snapshots hold (default 0: none)
	TeamMaxDiskMB     int // --team-max-disk-mb: the sum of their disk reservations, disk_mb (default 0: none)
	// ReserveMemoryMB is host memory (MemAvailable) kept free: below it new
	// sandboxes are refused (--reserve-memory-mb; default 5 % of the host,
	// 256 MiB to 2 GiB; -1 off).
	ReserveMemoryMB int
	// ReserveDiskMB is free space kept on the data directory's filesystem:
	// below it new sandboxes and snapshots are refused (--reserve-disk-mb;
	// default 5 % of the filesystem, 512 MiB to 10 GiB; -1 off).
	ReserveDiskMB int
	// Snapshots.
	SnapshotIntervalS int    // --snapshot-interval: automatic files snapshots (default 300; -1 off)
	RetentionDays     int    // --retention-days (default 7)
	CheckpointOnPause string // --checkpoint-on-pause: on|off (default on)
	SnapshotOnExec    string // --snapshot-on-exec: on|off (default off), a create's snapshot_on_exec default
	// QEMUCgroups is --qemu-cgroups: on|off (default on). Off runs QEMU VMs
	// without cgroups of their own (no CPU quota, memory or pids limit
	// beyond QEMU's -smp/-m), for hosts with no cgroup filesystem.
	QEMUCgroups string
	// Egress operator options, all off by default (defaults stay strict).
	EgressHosts     string // --egress-hosts: "name=ip[,name=ip]" names the proxy resolves itself
	EgressAllowCIDR string // --egress-allow-cidr: "10.0.0.0/8[,…]" private ranges the proxy may reach
	EgressRootCA    string // --egress-root-ca: PEM file of extra roots for upstream TLS verification
	// E2B compatibility (internal/e2b): off unless an address is given.
	E2BListen string // --e2b-listen: address of the E2B-compatible API (e.g. 127.0.0.1:3000)
	// E2BDomain is the domain the E2B API returns for its sandboxes (SDKs
	// then reach https://<port>-<id>.<domain> without E2B_SANDBOX_URL).
	E2BDomain string // --e2b-domain
	// DebugListen serves Go's pprof profiles (off unless a loopback
	// address is given: profiles reveal memory contents).
	DebugListen string // --debug-listen
	// MetricsListen moves /metrics off the API listener to an address of
	// its own (e.g. an internal interface for Prometheus); empty keeps it
	// on the API listener, next to the API.
	MetricsListen string // --metrics-listen
}

// DefaultDataDir is where a server keeps its state unless told otherwise.
const DefaultDataDir = "/var/lib/space"

// Defaults fills zero fields with defaults.
func (c *Config) Defaults() {
	if c.DataDir == "" {
		c.DataDir = DefaultDataDir
	}
	if c.CacheDir == "" {
		c.CacheDir = "/var/cache/space"
	}
	if c.Listen == "" {
		c.Listen = "127.0.0.1:7070"
	}
	if c.Driver == "" {
		c.Driver = "gvisor"
	}
	if c.DefaultTemplate == "" {
		c.DefaultTemplate = "base"
	}
	if c.LogLevel == "" {
		c.LogLevel = "info"
	}
	if c.LogFormat == "" {
		c.LogFormat = "text"
	}
	if c.MaxTimeoutS == 0 {
		c.MaxTimeoutS = 86400
	}
	if c.DefaultTimeoutS == 0 {
		// Within a cap set lower than the usual default (which Validate
		// would refuse).
		c.DefaultTimeoutS = 300
		if c.MaxTimeoutS > 0 && c.MaxTimeoutS < 300 {
			c.DefaultTimeoutS = c.MaxTimeoutS
		}
	}
	if c.PoolSize == 0 {
		c.PoolSize = 2
	}
	if c.SnapshotIntervalS == 0 {
		c.SnapshotIntervalS = 300
	}
	if c.RetentionDays == 0 {
		c.RetentionDays = 7
	}
	if c.SnapshotOnExec == "" {
		c.SnapshotOnExec = "off"
	}
	if c.CheckpointOnPause == "" {
		c.CheckpointOnPause = "on"
	}
	if c.QEMUCgroups == "" {
		c.QEMUCgroups = "on"
	}
	if c.AgentPath == "" {
		if exe, err := os.Executable(); err == nil {
			c.AgentPath = filepath.Join(filepath.Dir(exe), "space-agent")
		}
	}
}

// Validate checks the settings Defaults cannot fill in: the on|off
// switches take exactly on or off (a typo must not silently pick one).
func (c *Config) Validate() error {
	for _, f := range []struct {
		flag string
		v    int
	}{{"--team-max-sandboxes", c.TeamMaxSandboxes}, {"--team-max-memory-mb", c.TeamMaxMemoryMB}, {"--team-max-cpu", c.TeamMaxCPU}, {"--team-max-snapshot-mb", c.TeamMaxSnapshotMB}, {"--team-max-rps", c.TeamMaxRPS}, {"--team-max-disk-mb", c.TeamMaxDiskMB}} {
		if f.v < 0 {
			return fmt.Errorf("%s %d: want 0 (no limit) or more", f.flag, f.v)
		}
	}
	for _, f := range []struct {
		flag string
		v    int
	}{{"--reserve-memory-mb", c.ReserveMemoryMB}, {"--reserve-disk-mb", c.ReserveDiskMB}} {
		if f.v < -1 {
			return fmt.Errorf("%s %d: want -1 (off), 0 (the default) or more", f.flag, f.v)
		}
	}
	for _, f := range []struct{ flag, v string }{
		{"--checkpoint-on-pause", c.CheckpointOnPause},
		{"--snapshot-on-exec", c.SnapshotOnExec},
		{"--qemu-cgroups", c.QEMUCgroups},
	} {
		if f.v != "on" && f.v != "off" {
			return fmt.Errorf("%s %q: want on or off", f.flag, f.v)
		}
	}
	// Timeouts: a negative default gave every sandbox created without a
	// timeout an expiry in the past (the reaper killed it within a
	// second), and a default over the cap let a plain create pass it.
	switch {
	case c.MaxTimeoutS < 1:
		return fmt.Errorf("--max-timeout %d: want a number of seconds, 1 or more", c.MaxTimeoutS)
	case c.DefaultTimeoutS < 1:
		return fmt.Errorf("--default-timeout %d: want a number of seconds, 1 or more", c.DefaultTimeoutS)
	case c.DefaultTimeoutS > c.MaxTimeoutS:
		return fmt.Errorf("--default-timeout %d is over --max-timeout %d", c.DefaultTimeoutS, c.MaxTimeoutS)
	}
	// A negative retention made every named snapshot "too old" at the
	// first retention pass, and GC freed their data.
	if c.RetentionDays < 1 || c.RetentionDays > MaxRetentionDays {
		return fmt.Errorf("--retention-days %d: want 1 to %d", c.RetentionDays, MaxRetentionDays)
	}
	if c.SnapshotIntervalS < -1 {
		return fmt.Errorf("--snapshot-interval %d: want -1 (off), 0 (the default) or a number of seconds", c.SnapshotIntervalS)
	}
	if c.PoolSize < -1 || c.PoolSize > MaxPoolSize {
		return fmt.Errorf("--pool-size %d: want -1 (off), 0 (the default) or up to %d", c.PoolSize, MaxPoolSize)
	}
	if c.FirecrackerUID < 0 {
		return fmt.Errorf("--firecracker-uid %d: want a uid, 0 or more", c.FirecrackerUID)
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return fmt.Errorf("--log-level %q: want debug, info, warn or error", c.LogLevel)
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		return fmt.Errorf("--log-format %q: want text or json", c.LogFormat)
	}
	if c.Database != "" && !store.IsPostgres(c.Database) {
		return fmt.Errorf("--database: want a postgres:// URL (without it, the records are in space.db under --data)")
	}
	if c.E2BDomain != "" && !domainRE.MatchString(c.E2BDomain) {
		return fmt.Errorf("--e2b-domain %q: want a DNS name such as sandboxes.example.com", c.E2BDomain)
	}
	// A typo here was retried for good, with /healthz at 503 "starting".
	if _, err := template.Builtin(c.DefaultTemplate); err != nil {
		return fmt.Errorf("--template %q: %w", c.DefaultTemplate, err)
	}
	return nil
}

// domainRE is a DNS name of two or more labels, lower case.
var domainRE = regexp.MustCompile(`^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]([a-z0-9-]{0,61}[a-z0-9])?$`)

// MaxRetentionDays caps --retention-days (ten years).
const MaxRetentionDays = 3650

// Files a running server leaves in its data dir for local clients.
const (
	KeyFile   = "api-key"    // the admin key, mode 0600
	ServeFile = "serve.json" // {"url": "http://127.0.0.1:7070"} while the server runs
	LockFile  = "LOCK"       // flocked by the server using the data dir
)

// PoolSpec is one entry of --pool-drivers or --pools.
type PoolSpec struct {
	Template string // "": the default template (--pool-drivers)
	Driver   string // "": the default driver (--pools without @DRIVER)
	Size     int    // warm sandboxes kept ready (0: none)
	MemoryMB int    // their memory (0: a create's default)
	CPU      int    // their CPUs (0: a create's default)
}

// MaxPoolSize caps one --pool-drivers or --pools entry.
const MaxPoolSize = 64

// ParsePoolDrivers parses --pool-drivers: DRIVER=N[:MEMORY_MB[:CPUS]],…
// with a known driver name at most once, 0 ≤ N ≤ MaxPoolSize and, when
// given, MEMORY_MB ≥ 128 (what a VM needs; empty in N::CPUS) and 1 ≤ CPUS
// ≤ sandbox.DefaultMaxCPU. Empty: no entries.
func ParsePoolDrivers(v string) ([]PoolSpec, error) {
	return parsePools("--pool-drivers", "DRIVER", "e.g. qemu=2", v, func(name string) (PoolSpec, error) {
		return PoolSpec{Driver: name}, checkDriver(name)
	})
}

// ParsePools parses --pools: TEMPLATE[@DRIVER]=N[:MEMORY_MB[:CPUS]],… where
// TEMPLATE is a built-in template and DRIVER a known driver (the default
// driver without it), each TEMPLATE[@DRIVER] at most once, and N and
// MEMORY_MB and CPUS as for --pool-drivers. Empty: no entries.
func ParsePools(v string) ([]PoolSpec, error) {
	return parsePools("--pools", "TEMPLATE[@DRIVER]", "e.g. python-data=2,base@qemu=1:512,python-data@gvisor=1:2048:2", v, func(name string) (PoolSpec, error) {
		tpl, drv, withDriver := strings.Cut(name, "@")
		if _, err := template.Builtin(tpl); err != nil {
			known := []string{}
			for _, r := range template.Builtins() {
				known = append(known, r.Name)
			}
			return PoolSpec{}, fmt.Errorf("unknown template %q (known: %s)", tpl, strings.Join(known, ", "))
		}
		if withDriver {
			if err := checkDriver(drv); err != nil {
				return PoolSpec{}, err
			}
		}
		return PoolSpec{Template: tpl, Driver: drv}, nil
	})
}

// parsePools parses NAME=N[:MEMORY_MB[:CPUS]],… entries; spec turns a NAME into
// the entry's template and driver.
func parsePools(flag, nameForm, example, v string, spec func(name string) (PoolSpec, error)) ([]PoolSpec, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return nil, nil
	}
	bad := func(entry, format string, args ...any) error {
		return fmt.Errorf("%s %q: %s (want %s=N[:MEMORY_MB[:CPUS]],…, %s)", flag, entry, fmt.Sprintf(format, args...), nameForm, example)
	}
	var out []PoolSpec
	seen := map[string]bool{}
	for _, entry := range strings.Split(v, ",") {
		entry = strings.TrimSpace(entry)
		name, rest, ok := strings.Cut(entry, "=")
		name = strings.TrimSpace(name)
		if !ok || name == "" {
			return nil, bad(entry, "no %s=N", nameForm)
		}
		ps, err := spec(name)
		if err != nil {
			return nil, bad(entry, "%v", err)
		}
		if seen[name] {
			return nil, bad(entry, "%s given twice", name)
		}
		seen[name] = true
		parts := strings.Split(rest, ":")
		if len(parts) > 3 {
			return nil, bad(entry, "more than N:MEMORY_MB:CPUS")
		}
		if ps.Size, err = strconv.Atoi(strings.TrimSpace(parts[0])); err != nil || ps.Size < 0 || ps.Size > MaxPoolSize {
			return nil, bad(entry, "size must be a number from 0 to %d", MaxPoolSize)
		}
		// N:MEMORY_MB sets the memory; N::CPUS the CPUs alone.
		if len(parts) > 1 && (len(parts) == 2 || strings.TrimSpace(parts[1]) != "") {
			if ps.MemoryMB, err = strconv.Atoi(strings.TrimSpace(parts[1])); err != nil || ps.MemoryMB < 128 {
				return nil, bad(entry, "memory must be a number of MiB, at least 128")
			}
		}
		if len(parts) == 3 {
			if ps.CPU, err = strconv.Atoi(strings.TrimSpace(parts[2])); err != nil || ps.CPU < 1 || ps.CPU > sandbox.DefaultMaxCPU {
				return nil, bad(entry, "CPUs must be a number from 1 to %d", sandbox.DefaultMaxCPU)
			}
		}
		out = append(out, ps)
	}
	return out, nil
}

// checkDriver says whether name is a driver Run can build.
func checkDriver(name string) error {
	if !knownDrivers[name] {
		return fmt.Errorf("unknown driver %q (known: gvisor, qemu, firecracker)", name)
	}
	return nil
}

// knownDrivers are the driver names Run can build.
var knownDrivers = map[string]bool{"gvisor": true, "qemu": true, "firecracker": true}
