package cli

import (
	"context"
	"fmt"
	"strconv"

	space "github.com/spacesandbox/space/sdk/go"
	"github.com/spf13/cobra"
)

// history: the versions of one file across a sandbox's timeline; and the
// file diff of diff --path.

func (a *app) historyCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "history <id> <path>",
		Short: "List the versions of a file across a sandbox's snapshots",
		Long: "List the versions of one file across a sandbox's snapshot timeline, oldest first: one line " +
			"per snapshot where its content changed, with the command that changed it (a sandbox created " +
			"with --snapshot-on-exec has a snapshot after every command), its size and SHA-256. Show a " +
			"change with space diff <id> <from> <to> --path <path>; undo one with space restore <id> " +
			"--before <command-id> <path>.",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.sdk()
			if err != nil {
				return err
			}
			vs, err := c.FileHistory(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			if asJSON {
				if vs == nil {
					vs = []space.FileVersion{}
				}
				return printJSON(a.stdout, vs)
			}
			tw := newTable(a.stdout, "SNAPSHOT", "CREATED", "CMD", "SIZE", "SHA256", "COMMAND")
			for _, v := range vs {
				snap, created := v.Snapshot, fmtTime(v.CreatedAt)
				if v.Template {
					snap, created = "(template)", "-"
				}
				cmdID := "-"
				if v.CommandID != 0 {
					cmdID = strconv.FormatInt(v.CommandID, 10)
				}
				size, sum := fmtBytes(v.Size), "-"
				switch {
				case v.Deleted:
					size = "deleted"
				case v.SHA256 != "":
					sum = v.SHA256[:12]
				case v.Type != space.FileTypeFile:
					size = v.Type
				}
				row(tw, snap, created, cmdID, size, sum, firstNonEmpty(v.Command, "-"))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the versions as JSON")
	return cmd
}

// diffFile prints the unified diff of one file between two snapshots.
func (a *app) diffFile(ctx context.Context, c *space.Client, from, to, path string, asJSON bool) error {
	d, err := c.DiffFile(ctx, from, to, path)
	if err != nil {
		return err
	}
	switch {
	case asJSON:
		return printJSON(a.stdout, d)
	case d.Binary:
		fmt.Fprintf(a.stdout, "Binary file %s differs (%d → %d bytes)\n", d.Path, d.FromSize, d.ToSize)
	case d.TooLarge:
		fmt.Fprintf(a.stdout, "File %s is too large to diff (%d → %d bytes)\n", d.Path, d.FromSize, d.ToSize)
	case d.Same:
		fmt.Fprintf(a.stderr, "%s is the same in both snapshots\n", d.Path)
	default:
		fmt.Fprint(a.stdout, d.Diff)
	}
	return nil
}
