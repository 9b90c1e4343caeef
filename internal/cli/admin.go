package cli

import (
	"cmp"
	"fmt"
	"runtime/debug"
	"strconv"
	"strings"

	space "github.com/spacesandbox/space/sdk/go"
	"github.com/spf13/cobra"
)

// Version is the release version, set at build time with
// -ldflags "-X github.com/spacesandbox/space/internal/cli.Version=v1.2.3".
var Version = ""

func version() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

func (a *app) versionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintln(a.stdout, "space", version())
		},
	}
}

func (a *app) healthCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "health",
		Short: "Check that the server is ready to create sandboxes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.sdk()
			if err != nil {
				return err
			}
			h, err := c.Health(cmd.Context())
			if err != nil {
				return err
			}
			fmt.Fprintln(a.stdout, h.Status)
			return nil
		},
	}
}

func (a *app) poolsCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "pools",
		Short: "Show the warm pools: sandboxes started ahead of demand (admin)",
		Long: "Show the warm pools: sandboxes started ahead of demand (admin).\n\n" +
			"`space pools set` changes one while the server runs; `space pools reset` returns it to the server's command line.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.sdk()
			if err != nil {
				return err
			}
			ps, err := c.Pools(cmd.Context())
			if err != nil {
				return err
			}
			tw := newTable(a.stdout, "TEMPLATE", "DRIVER", "CPU", "MEMORY", "STATE", "READY", "TARGET", "SIZE", "MAX", "REFILL", "SOURCE", "PRESTART")
			for _, p := range ps {
				refill := "boot"
				if p.FromImage {
					refill = "restore"
				}
				prestart := "-"
				if len(p.Prestart) > 0 {
					prestart = strings.Join(p.Prestart, " ")
				}
				row(tw, p.Template, p.Driver, strconv.Itoa(p.CPU), strconv.Itoa(p.MemoryMB)+" MiB", strings.ReplaceAll(cmp.Or(p.State, "running"), "_", " "), strconv.Itoa(p.Ready),
					strconv.Itoa(p.Target), strconv.Itoa(p.Size), strconv.Itoa(p.Max), refill, cmp.Or(p.Source, "-"), prestart)
			}
			return tw.Flush()
		},
	}
	var req space.SetPoolRequest
	set := &cobra.Command{
		Use:   "set TEMPLATE SIZE",
		Short: "Set a template's warm pool while the server runs (admin; kept across restarts until reset)",
		Long: "Set a template's warm pool on a driver while the server runs (admin).\n\n" +
			"It replaces the server's command line (--pool-size, --pool-drivers, --pools) for that template and driver, " +
			"applies at once and is kept across restarts until `space pools reset`. SIZE 0 turns the pool off.",
		Example: "  space pools set python-data 4\n  space pools set base 2 --driver qemu --memory 512\n  space pools set base 0",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := strconv.Atoi(args[1])
			if err != nil || n < 0 {
				return fmt.Errorf("SIZE %q: want a whole number, 0 or more", args[1])
			}
			req.Size = n
			c, err := a.sdk()
			if err != nil {
				return err
			}
			p, err := c.SetPool(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			a.printPoolSetting(p)
			return nil
		},
	}
	set.Flags().StringVar(&req.Driver, "driver", "", "driver (default: the server's)")
	set.Flags().IntVar(&req.Max, "max", 0, "the most the pool grows to with the create rate (default 4×SIZE)")
	set.Flags().IntVar(&req.MemoryMB, "memory", 0, "the pooled sandboxes' memory in MiB (default: a create's)")
	set.Flags().IntVar(&req.CPU, "cpu", 0, "their CPUs (default: a create's)")
	var noPrestart bool
	set.Flags().BoolVar(&noPrestart, "no-prestart", false, "do not start the template's prestarted process (the E2B code interpreter's kernel in python-data pools) in each warm sandbox")
	set.PreRun = func(*cobra.Command, []string) {
		if noPrestart {
			f := false
			req.Prestart = &f
		}
	}
	var driver string
	reset := &cobra.Command{
		Use:   "reset TEMPLATE",
		Short: "Return a template's warm pool to the server's command line (admin)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.sdk()
			if err != nil {
				return err
			}
			p, err := c.ResetPool(cmd.Context(), args[0], driver)
			if err != nil {
				return err
			}
			a.printPoolSetting(p)
			return nil
		},
	}
	reset.Flags().StringVar(&driver, "driver", "", "driver (default: the server's)")
	cmd.AddCommand(set, reset)
	return cmd
}

// printPoolSetting prints the pool that applies after a set or reset.
func (a *app) printPoolSetting(p *space.PoolSetting) {
	if p.Size == 0 {
		fmt.Fprintf(a.stdout, "%s on %s: no pool (source %s)\n", p.Template, p.Driver, p.Source)
		return
	}
	prestart := ""
	if p.Prestart {
		prestart = ", prestarted"
	}
	fmt.Fprintf(a.stdout, "%s on %s: size %d, max %d, %d MiB, %d CPU%s (source %s): %s\n",
		p.Template, p.Driver, p.Size, p.Max, p.MemoryMB, p.CPU, prestart, p.Source, strings.ReplaceAll(p.State, "_", " "))
}

func (a *app) templateCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "template",
		Short: "List and build templates",
	}
	list := &cobra.Command{
		Use:   "list",
		Short: "List templates",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.sdk()
			if err != nil {
				return err
			}
			ts, err := c.Templates(cmd.Context())
			if err != nil {
				return err
			}
			tw := newTable(a.stdout, "NAME", "KIND", "STATUS", "SIZE", "BUILT", "DESCRIPTION")
			for _, t := range ts {
				row(tw, t.Name, t.Kind, t.Status, fmtBytes(t.SizeBytes), fmtTime(t.BuiltAt), t.Description)
			}
			return tw.Flush()
		},
	}
	build := &cobra.Command{
		Use:   "build <name>",
		Short: "Build a template (admin), printing build output",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.sdk()
			if err != nil {
				return err
			}
			t, err := c.BuildTemplate(cmd.Context(), args[0], func(line string) {
				fmt.Fprintln(a.stdout, line)
			})
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "built %s %s (%s)\n", t.Name, t.Digest, fmtBytes(t.SizeBytes))
			return nil
		},
	}
	cmd.AddCommand(list, build)
	return cmd
}

func (a *app) keysCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "keys",
		Short: "Manage API keys (admin)",
	}
	var req space.CreateKeyRequest
	create := &cobra.Command{
		Use:   "create --team NAME [--name N]",
		Short: "Create an API key and print it (it is shown only once)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if req.Team == "" {
				return usageError(cmd, "--team is required")
			}
			c, err := a.sdk()
			if err != nil {
				return err
			}
			k, err := c.CreateKey(cmd.Context(), req)
			if err != nil {
				return err
			}
			fmt.Fprintln(a.stdout, k.Key)
			fmt.Fprintf(a.stderr, "created key %s for team %s; the key above is not shown again\n", k.ID, k.Team)
			return nil
		},
	}
	create.Flags().StringVar(&req.Team, "team", "", "team the key belongs to (required)")
	create.Flags().StringVar(&req.Name, "name", "", "a name for the key")
	list := &cobra.Command{
		Use:   "list",
		Short: "List API keys",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.sdk()
			if err != nil {
				return err
			}
			keys, err := c.ListKeys(cmd.Context())
			if err != nil {
				return err
			}
			tw := newTable(a.stdout, "ID", "TEAM", "NAME", "CREATED")
			for _, k := range keys {
				row(tw, k.ID, k.Team, firstNonEmpty(k.Name, "-"), fmtTime(k.CreatedAt))
			}
			return tw.Flush()
		},
	}
	del := &cobra.Command{
		Use:   "delete <id>",
		Short: "Revoke an API key",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.sdk()
			if err != nil {
				return err
			}
			return c.DeleteKey(cmd.Context(), args[0])
		},
	}
	cmd.AddCommand(create, list, del)
	return cmd
}

func fmtBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

func (a *app) quotaCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "quota",
		Short: "Show and set a team's quota (sandboxes, memory and CPUs it may hold at once, data its snapshots may keep)",
	}
	var asJSON bool
	show := func(q *space.Quota) error {
		if asJSON {
			return printJSON(a.stdout, q)
		}
		limit := func(n int, unit string) string {
			if n == 0 {
				return "no limit"
			}
			return fmt.Sprintf("%d%s", n, unit)
		}
		fmt.Fprintf(a.stdout, "team      %s (%s quota)\n", q.Team, q.Source)
		fmt.Fprintf(a.stdout, "sandboxes %d of %s\n", q.Usage.Sandboxes, limit(q.MaxSandboxes, ""))
		fmt.Fprintf(a.stdout, "memory    %d MiB of %s\n", q.Usage.MemoryMB, limit(q.MaxMemoryMB, " MiB"))
		fmt.Fprintf(a.stdout, "cpu       %d of %s\n", q.Usage.CPU, limit(q.MaxCPU, ""))
		fmt.Fprintf(a.stdout, "disk      %d MiB of %s\n", q.Usage.DiskMB, limit(q.MaxDiskMB, " MiB"))
		fmt.Fprintf(a.stdout, "snapshots %d MiB of %s\n", q.Usage.SnapshotMB, limit(q.MaxSnapshotMB, " MiB"))
		fmt.Fprintf(a.stdout, "requests  %s\n", limit(q.MaxRPS, " per second"))
		return nil
	}
	get := &cobra.Command{
		Use:   "get <team>",
		Short: "Show a team's quota and what it holds (a team key: its own team)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.sdk()
			if err != nil {
				return err
			}
			q, err := c.GetQuota(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return show(q)
		},
	}
	get.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	var maxSandboxes, maxMemory, maxCPU, maxSnapshot, maxRPS, maxDisk int
	set := &cobra.Command{
		Use:   "set <team> [--max-sandboxes N] [--max-memory-mb N] [--max-cpu N] [--max-snapshot-mb N] [--max-rps N] [--max-disk-mb N]",
		Short: "Give a team a quota of its own (admin; 0 is no limit, a limit not given is none)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var req space.SetQuotaRequest
			if cmd.Flags().Changed("max-sandboxes") {
				req.MaxSandboxes = &maxSandboxes
			}
			if cmd.Flags().Changed("max-memory-mb") {
				req.MaxMemoryMB = &maxMemory
			}
			if cmd.Flags().Changed("max-cpu") {
				req.MaxCPU = &maxCPU
			}
			if cmd.Flags().Changed("max-snapshot-mb") {
				req.MaxSnapshotMB = &maxSnapshot
			}
			if cmd.Flags().Changed("max-rps") {
				req.MaxRPS = &maxRPS
			}
			if cmd.Flags().Changed("max-disk-mb") {
				req.MaxDiskMB = &maxDisk
			}
			if req.MaxSandboxes == nil && req.MaxMemoryMB == nil && req.MaxCPU == nil && req.MaxSnapshotMB == nil && req.MaxRPS == nil && req.MaxDiskMB == nil {
				return usageError(cmd, "give --max-sandboxes, --max-memory-mb, --max-cpu, --max-snapshot-mb, --max-rps, --max-disk-mb or some of them")
			}
			c, err := a.sdk()
			if err != nil {
				return err
			}
			q, err := c.SetQuota(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			return show(q)
		},
	}
	set.Flags().IntVar(&maxSandboxes, "max-sandboxes", 0, "sandboxes held at once, running or paused (0: no limit)")
	set.Flags().IntVar(&maxMemory, "max-memory-mb", 0, "memory in MiB of those sandboxes together (0: no limit)")
	set.Flags().IntVar(&maxCPU, "max-cpu", 0, "CPUs of those sandboxes together (0: no limit)")
	set.Flags().IntVar(&maxSnapshot, "max-snapshot-mb", 0, "data in MiB the team's snapshots may hold (0: no limit)")
	set.Flags().IntVar(&maxRPS, "max-rps", 0, "API requests per second, a second's worth at once (0: no limit)")
	set.Flags().IntVar(&maxDisk, "max-disk-mb", 0, "disk in MiB those sandboxes may reserve together, the sum of their disk_mb (0: no limit)")
	set.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	reset := &cobra.Command{
		Use:   "reset <team>",
		Short: "Return a team to the server's default quota (admin)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.sdk()
			if err != nil {
				return err
			}
			return c.DeleteQuota(cmd.Context(), args[0])
		},
	}
	cmd.AddCommand(get, set, reset)
	return cmd
}
