package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strconv"

	space "github.com/spacesandbox/space/sdk/go"
	"github.com/spf13/cobra"
)

// Snapshot verbs: snapshot, snapshots, diff, restore, snapshot-cat,
// snapshot-rm, and fork.

func (a *app) snapshotCommand() *cobra.Command {
	var (
		req           space.SnapshotRequest
		files, asJSON bool
		quiet         bool
	)
	cmd := &cobra.Command{
		Use:   "snapshot <id> [--name N] [--files]",
		Short: "Snapshot a running sandbox and print the snapshot's id and sizes",
		Long: "Snapshot a running sandbox. The default kind, checkpoint, holds memory, processes and files " +
			"(the sandbox can be forked or recreated from it); --files takes only the files, without stopping the sandbox.\n\n" +
			"Prints: <snapshot id> (<kind>, <bytes new> new, <bytes total> total).",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req.Kind = space.SnapshotCheckpoint
			if files {
				req.Kind = space.SnapshotFiles
			}
			c, err := a.sdk()
			if err != nil {
				return err
			}
			sn, err := c.CreateSnapshot(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			switch {
			case asJSON:
				return printJSON(a.stdout, sn)
			case quiet:
				fmt.Fprintln(a.stdout, sn.ID)
			default:
				fmt.Fprintf(a.stdout, "%s (%s, %s new, %s total)\n", sn.ID, sn.Kind, fmtBytes(sn.BytesNew), fmtBytes(sn.BytesTotal))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.Name, "name", "", "a name for the snapshot")
	f.BoolVar(&files, "files", false, "snapshot only the files (kind files) instead of a full checkpoint")
	f.BoolVarP(&quiet, "quiet", "q", false, "print only the snapshot id")
	f.BoolVar(&asJSON, "json", false, "print the snapshot as JSON")
	return cmd
}

func (a *app) snapshotsCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "snapshots <id>",
		Short: "List a sandbox's snapshots, oldest first",
		Long:  "List a sandbox's snapshot timeline, oldest first. It still works after the sandbox is gone, while its snapshots are kept.",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.sdk()
			if err != nil {
				return err
			}
			snaps, err := c.ListSnapshots(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				if snaps == nil {
					snaps = []space.Snapshot{}
				}
				return printJSON(a.stdout, snaps)
			}
			tw := newTable(a.stdout, "ID", "KIND", "NAME", "AUTO", "CREATED", "NEW", "TOTAL", "STATUS")
			for _, sn := range snaps {
				auto := "no"
				if sn.Automatic {
					auto = "yes"
				}
				status := sn.Status
				if sn.Error != "" {
					status += " (" + sn.Error + ")"
				}
				row(tw, sn.ID, sn.Kind, firstNonEmpty(sn.Name, "-"), auto, fmtTime(sn.CreatedAt),
					fmtBytes(sn.BytesNew), fmtBytes(sn.BytesTotal), status)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func (a *app) diffCommand() *cobra.Command {
	var asJSON bool
	var path string
	cmd := &cobra.Command{
		Use:   "diff [<id>] <from-snapshot> <to-snapshot> [--path P]",
		Short: "Show which files changed between two snapshots, or a file's unified diff",
		Long: "Show which files changed between two snapshots, one line per path:\n\n" +
			"  A /path (13 bytes)        added\n" +
			"  D /path (3 bytes)         removed\n" +
			"  M /path (3 → 13 bytes)    modified\n\n" +
			"Directories and links show their type instead of sizes. With a sandbox id, both snapshots " +
			"must belong to that sandbox (a guard against mixing up ids); without one, any two of your " +
			"snapshots can be compared, e.g. a fork's against its parent's.\n\n" +
			"With --path, the unified diff of that one text file instead (a binary file, or one over " +
			"1 MiB, is reported as such).",
		Args: cobra.RangeArgs(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.sdk()
			if err != nil {
				return err
			}
			from, to := args[len(args)-2], args[len(args)-1]
			if len(args) == 3 {
				if err := checkOwner(cmd.Context(), c, args[0], from, to); err != nil {
					return err
				}
			}
			if path != "" {
				return a.diffFile(cmd.Context(), c, from, to, path, asJSON)
			}
			changes, err := c.DiffSnapshots(cmd.Context(), from, to)
			if err != nil {
				return err
			}
			if asJSON {
				if changes == nil {
					changes = []space.Change{}
				}
				return printJSON(a.stdout, changes)
			}
			for _, ch := range changes {
				fmt.Fprintln(a.stdout, fmtChange(ch))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the changes as JSON")
	cmd.Flags().StringVar(&path, "path", "", "show the unified diff of this file")
	return cmd
}

// checkOwner fails unless every snapshot in sids belongs to sandbox id.
func checkOwner(ctx context.Context, c *space.Client, id string, sids ...string) error {
	for _, sid := range sids {
		sn, err := c.GetSnapshot(ctx, sid, false)
		if err != nil {
			return err
		}
		if sn.SandboxID != id {
			return fmt.Errorf("snapshot %s belongs to sandbox %s, not %s", sid, sn.SandboxID, id)
		}
	}
	return nil
}

// fmtChange renders one change as "M /path (3 → 13 bytes)".
func fmtChange(ch space.Change) string {
	letter := map[string]string{space.ChangeAdded: "A", space.ChangeRemoved: "D", space.ChangeModified: "M"}[ch.Kind]
	if letter == "" {
		letter = "?"
	}
	var detail string
	switch {
	case ch.Type != space.FileTypeFile && ch.Type != "":
		detail = ch.Type
	case ch.Kind == space.ChangeAdded:
		detail = fmt.Sprintf("%d bytes", ch.NewSize)
	case ch.Kind == space.ChangeRemoved:
		detail = fmt.Sprintf("%d bytes", ch.OldSize)
	default:
		detail = fmt.Sprintf("%d → %d bytes", ch.OldSize, ch.NewSize)
	}
	return fmt.Sprintf("%s %s (%s)", letter, ch.Path, detail)
}

func (a *app) restoreCommand() *cobra.Command {
	var sid string
	var before int64
	cmd := &cobra.Command{
		Use:   "restore <id> (--snapshot <sid> | --before <command-id>) [paths...]",
		Short: "Bring files of a running sandbox back to how they were in a snapshot",
		Long: "Bring the given paths (every path when none are given) of a running sandbox back to how they " +
			"were in a snapshot: changed files are rewritten and files added since are removed. " +
			"With --before, as they were before that command (an id from space commands) started: " +
			"from the newest snapshot taken before it (a sandbox created with --snapshot-on-exec has " +
			"one after every command); a file that did not exist then is removed. " +
			"Prints one line per path: \"restored /path\" or \"removed /path\".",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if (sid == "") == (before == 0) {
				return usageError(cmd, "give --snapshot or --before")
			}
			c, err := a.sdk()
			if err != nil {
				return err
			}
			var res *space.RestoreResult
			if before != 0 {
				res, err = c.RestoreBefore(cmd.Context(), args[0], before, args[1:])
			} else {
				res, err = c.RestoreFiles(cmd.Context(), args[0], sid, args[1:])
			}
			if err != nil {
				return err
			}
			for _, p := range res.Written {
				fmt.Fprintln(a.stdout, "restored "+p)
			}
			for _, p := range res.Removed {
				fmt.Fprintln(a.stdout, "removed "+p)
			}
			if len(res.Written)+len(res.Removed) == 0 {
				fmt.Fprintln(a.stderr, "nothing to restore: the files already match the snapshot")
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&sid, "snapshot", "", "snapshot to restore from")
	cmd.Flags().Int64Var(&before, "before", 0, "restore as the files were before this command id (space commands) started")
	return cmd
}

func (a *app) snapshotCatCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "snapshot-cat <sid> <path>",
		Short: "Print a file as it was in a snapshot (or list a directory)",
		Long: "Copy a file's bytes, as they were in the snapshot, to stdout. When path is a directory, " +
			"list it instead (mode, size, time, name), like `space ls -l`.",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			sid, path := args[0], args[1]
			c, err := a.sdk()
			if err != nil {
				return err
			}
			rc, err := c.ReadSnapshotFile(cmd.Context(), sid, path)
			if errors.Is(err, space.ErrIsDir) {
				return a.listSnapshotDir(cmd.Context(), c, sid, path)
			}
			if err != nil {
				return err
			}
			defer rc.Close()
			_, err = io.Copy(a.stdout, rc)
			return err
		},
	}
}

func (a *app) listSnapshotDir(ctx context.Context, c *space.Client, sid, path string) error {
	ents, err := c.ListSnapshotDir(ctx, sid, path)
	if err != nil {
		return err
	}
	tw := newTable(a.stdout, "MODE", "SIZE", "MODIFIED", "NAME")
	for _, e := range ents {
		n := e.Name
		if e.IsDir() {
			n += "/"
		}
		if e.Target != "" {
			n += " -> " + e.Target
		}
		row(tw, snapshotEntryMode(e).String(), strconv.FormatInt(e.Size, 10), fmtTime(e.MTime), n)
	}
	return tw.Flush()
}

func snapshotEntryMode(e space.SnapshotEntry) fs.FileMode {
	m := fs.FileMode(e.Mode) & fs.ModePerm
	switch e.Type {
	case space.FileTypeFile, "hardlink":
	case space.FileTypeDir:
		m |= fs.ModeDir
	case space.FileTypeSymlink:
		m |= fs.ModeSymlink
	default:
		m |= fs.ModeIrregular
	}
	return m
}

func (a *app) snapshotRmCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "snapshot-rm <sid>...",
		Short: "Delete snapshots",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, sids []string) error {
			c, err := a.sdk()
			if err != nil {
				return err
			}
			failed := 0
			for _, sid := range sids {
				if err := c.DeleteSnapshot(cmd.Context(), sid); err != nil {
					fmt.Fprintf(a.stderr, "space: %s: %s\n", sid, a.explain(err))
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

func (a *app) forkCommand() *cobra.Command {
	var (
		req    space.ForkRequest
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "fork <id> [--count N] [--snapshot S]",
		Short: "Start copies of a sandbox and print their ids",
		Long: "Start copies of a sandbox, memory and processes included, and print their ids, one a line. " +
			"They copy its running state now, or with --snapshot, that checkpoint of it.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if req.Count < 0 {
				return usageError(cmd, "bad --count %d: want a positive number", req.Count)
			}
			c, err := a.sdk()
			if err != nil {
				return err
			}
			kids, err := c.Fork(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			if asJSON {
				if kids == nil {
					kids = []space.Sandbox{}
				}
				return printJSON(a.stdout, kids)
			}
			for _, k := range kids {
				fmt.Fprintln(a.stdout, k.ID)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&req.Count, "count", 1, "how many copies")
	f.StringVar(&req.Snapshot, "snapshot", "", "fork from this checkpoint instead of the running state")
	f.BoolVar(&asJSON, "json", false, "print the new sandboxes as JSON")
	return cmd
}
