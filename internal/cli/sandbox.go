package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	space "github.com/spacesandbox/space/sdk/go"
	"github.com/spf13/cobra"
)

func (a *app) createCommand() *cobra.Command {
	var (
		req       space.CreateSandboxRequest
		env, meta []string
		asJSON    bool
		network   networkFlags
		onExec    bool
	)
	cmd := &cobra.Command{
		Use:   "create [flags]",
		Short: "Create a sandbox and print its id",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if req.Snapshot != "" && req.Template != "" {
				return usageError(cmd, "give --template or --from-snapshot, not both")
			}
			var err error
			if req.Env, err = parseKV("env", env); err != nil {
				return err
			}
			if req.Metadata, err = parseKV("metadata", meta); err != nil {
				return err
			}
			network.apply(cmd, &req)
			if cmd.Flags().Changed("snapshot-on-exec") {
				req.SnapshotOnExec = &onExec
			}
			c, err := a.sdk()
			if err != nil {
				return err
			}
			sb, err := c.CreateSandbox(cmd.Context(), req)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(a.stdout, sb)
			}
			fmt.Fprintln(a.stdout, sb.ID)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.Template, "template", "", "template to create from (server default: base)")
	f.StringVar(&req.Snapshot, "from-snapshot", "", "create from this snapshot (a checkpoint resumes its processes; a files snapshot boots its template with those files); excludes --template")
	f.IntVar(&req.TimeoutS, "timeout", 0, "seconds until the --on-timeout action (server default: 300)")
	f.StringVar(&req.OnTimeout, "on-timeout", "", "what happens at the timeout: kill or pause (server default: kill)")
	f.BoolVar(&req.AutoResume, "auto-resume", false, "while paused, a command, file or port request resumes it first")
	f.BoolVar(&onExec, "snapshot-on-exec", false, "a files snapshot after every command that changed files (see space history; server default: off)")
	f.StringArrayVar(&env, "env", nil, "environment variable KEY=VALUE for every process (repeatable)")
	f.StringArrayVar(&meta, "metadata", nil, "metadata KEY=VALUE (repeatable)")
	f.IntVar(&req.CPU, "cpu", 0, "vCPUs")
	f.IntVar(&req.MemoryMB, "memory", 0, "memory in MB")
	f.IntVar(&req.DiskMB, "disk", 0, "disk in MiB its files may fill (server default: 10240)")
	f.BoolVar(&asJSON, "json", false, "print the sandbox as JSON")
	network.register(cmd)
	return cmd
}

func (a *app) listCommand() *cobra.Command {
	var (
		states, meta []string
		asJSON       bool
	)
	cmd := &cobra.Command{
		Use:   "list [flags]",
		Short: "List sandboxes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts := space.ListOptions{}
			for _, s := range states {
				opts.State = append(opts.State, space.State(s))
			}
			var err error
			if opts.Metadata, err = parseKV("metadata", meta); err != nil {
				return err
			}
			c, err := a.sdk()
			if err != nil {
				return err
			}
			all := []space.Sandbox{}
			for sb, err := range c.AllSandboxes(cmd.Context(), opts) {
				if err != nil {
					return err
				}
				all = append(all, sb)
			}
			if asJSON {
				return printJSON(a.stdout, all)
			}
			tw := newTable(a.stdout, "ID", "STATE", "TEMPLATE", "CREATED", "EXPIRES", "METADATA")
			for _, sb := range all {
				state := string(sb.State)
				if sb.Reason != "" {
					state += " (" + sb.Reason + ")"
				}
				row(tw, sb.ID, state, sb.Template, fmtTime(sb.CreatedAt), fmtTime(sb.ExpiresAt), fmtMap(sb.Metadata))
			}
			return tw.Flush()
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&states, "state", nil, "only sandboxes in this state (repeatable)")
	f.StringArrayVar(&meta, "metadata", nil, "only sandboxes with metadata KEY=VALUE (repeatable)")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func (a *app) killCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "kill <id>...",
		Short: "Destroy sandboxes",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, ids []string) error {
			c, err := a.sdk()
			if err != nil {
				return err
			}
			failed := 0
			for _, id := range ids {
				if err := c.KillSandbox(cmd.Context(), id); err != nil {
					fmt.Fprintf(a.stderr, "space: %s: %s\n", id, a.explain(err))
					failed++
				}
			}
			if failed > 0 {
				return exitCode(1)
			}
			return nil
		},
	}
}

func (a *app) timeoutCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "timeout <id> <seconds>",
		Short: "Reset a sandbox's timeout to <seconds> from now",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			secs, err := strconv.Atoi(args[1])
			if err != nil || secs <= 0 {
				return usageError(cmd, "bad timeout %q: want a positive number of seconds", args[1])
			}
			c, err := a.sdk()
			if err != nil {
				return err
			}
			sb, err := c.SetTimeout(cmd.Context(), args[0], secs)
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "%s expires at %s\n", sb.ID, fmtTime(sb.ExpiresAt))
			return nil
		},
	}
}

func (a *app) metricsCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "metrics <id>",
		Short: "Show a running sandbox's CPU, memory and disk use",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.sdk()
			if err != nil {
				return err
			}
			m, err := c.SandboxMetrics(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(a.stdout, m)
			}
			fmt.Fprintf(a.stdout, "cpu     %5.1f%% of %d\nmemory  %s of %s (cache %s)\ndisk    %s of %s\n",
				m.CPUUsedPct, m.CPUCount, fmtBytes(m.MemUsedBytes), fmtBytes(m.MemTotalBytes), fmtBytes(m.MemCacheBytes),
				fmtBytes(m.DiskUsedBytes), fmtBytes(m.DiskTotalBytes))
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the sample as JSON")
	return cmd
}

func (a *app) pauseCommand() *cobra.Command {
	return a.stateCommand("pause", "Pause a running sandbox (its processes stop until resume)", (*space.Client).PauseSandbox)
}

func (a *app) resumeCommand() *cobra.Command {
	return a.stateCommand("resume", "Resume a paused sandbox", (*space.Client).ResumeSandbox)
}

// stateCommand is a verb that moves sandboxes to another state and prints
// each one's new state.
func (a *app) stateCommand(verb, short string, op func(*space.Client, context.Context, string) (*space.Sandbox, error)) *cobra.Command {
	return &cobra.Command{
		Use:   verb + " <id>...",
		Short: short,
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, ids []string) error {
			c, err := a.sdk()
			if err != nil {
				return err
			}
			failed := 0
			for _, id := range ids {
				sb, err := op(c, cmd.Context(), id)
				if err != nil {
					fmt.Fprintf(a.stderr, "space: %s: %s\n", id, a.explain(err))
					failed++
					continue
				}
				fmt.Fprintf(a.stdout, "%s %s\n", sb.ID, sb.State)
			}
			if failed > 0 {
				return exitCode(1)
			}
			return nil
		},
	}
}

// Output helpers.

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func newTable(w io.Writer, header ...string) *tabwriter.Writer {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row(tw, header...)
	return tw
}

func row(tw *tabwriter.Writer, cols ...string) {
	fmt.Fprintln(tw, strings.Join(cols, "\t"))
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Local().Format(time.DateTime)
}

func fmtMap(m map[string]string) string {
	if len(m) == 0 {
		return "-"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, k+"="+m[k])
	}
	return strings.Join(parts, ",")
}
