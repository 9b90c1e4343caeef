package cli

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	space "github.com/spacesandbox/space/sdk/go"
	"github.com/spf13/cobra"
)

// location is one side of cp: a local path ("-" for stdin/stdout) or a path
// in a sandbox.
type location struct {
	ID   string // sandbox id; empty for a local path
	Path string
}

func (l location) remote() bool { return l.ID != "" }

// parseLocation reads "<id>:/abs/path" as a sandbox path and anything else as
// a local path. A prefix containing '/' is never an id, so ./a:b is local.
func parseLocation(s string) (location, error) {
	id, p, ok := strings.Cut(s, ":")
	if !ok || id == "" || strings.Contains(id, "/") {
		if s == "" {
			return location{}, errors.New("empty path")
		}
		return location{Path: s}, nil
	}
	if !strings.HasPrefix(p, "/") {
		return location{}, fmt.Errorf("%q: the sandbox path must be absolute (%s:/path)", s, id)
	}
	return location{ID: id, Path: path.Clean(p)}, nil
}

func (a *app) cpCommand() *cobra.Command {
	var user string
	cmd := &cobra.Command{
		Use:   "cp <src> <dst>",
		Short: "Copy a file to or from a sandbox (one side is <id>:/path; - is stdin/stdout)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, err := parseLocation(args[0])
			if err != nil {
				return err
			}
			dst, err := parseLocation(args[1])
			if err != nil {
				return err
			}
			if src.remote() == dst.remote() {
				return usageError(cmd, "exactly one of src and dst must be <id>:/path")
			}
			c, err := a.sdk()
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if dst.remote() {
				return a.upload(ctx, c, src.Path, dst, strings.HasSuffix(args[1], "/"), user)
			}
			if user != "" {
				return usageError(cmd, "--user is for copies into a sandbox")
			}
			return a.download(ctx, c, src, dst.Path)
		},
	}
	cmd.Flags().StringVar(&user, "user", "", "the user who owns the copy in the sandbox (default: its default user)")
	return cmd
}

// upload streams a local file (or stdin) to dst; a dst that is a directory
// (or ends in /) receives the file under its base name.
func (a *app) upload(ctx context.Context, c *space.Client, local string, dst location, dstIsDir bool, user string) error {
	var r io.Reader = a.stdin
	sum := "" // SHA-256 of a local file, checked by the server
	if local != "-" {
		f, err := os.Open(local)
		if err != nil {
			return err
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return err
		}
		if st.IsDir() {
			return fmt.Errorf("%s is a directory (cp copies single files)", local)
		}
		// A regular file is hashed first, so the server writes it only if
		// every byte arrived as it was read here.
		if st.Mode().IsRegular() {
			h := sha256.New()
			if _, err := io.Copy(h, f); err != nil {
				return err
			}
			if _, err := f.Seek(0, io.SeekStart); err != nil {
				return err
			}
			sum = hex.EncodeToString(h.Sum(nil))
		}
		r = f
		if !dstIsDir {
			fi, err := c.Stat(ctx, dst.ID, dst.Path)
			switch {
			case err == nil:
				dstIsDir = fi.IsDir()
			case !space.IsNotFound(err):
				return err
			}
		}
		if dstIsDir {
			dst.Path = path.Join(dst.Path, filepath.Base(local))
		}
	} else if dstIsDir {
		return errors.New("cannot copy stdin into a directory: name the file")
	}
	_, err := c.WriteFileChecked(ctx, dst.ID, dst.Path, user, sum, r)
	return err
}

// download copies src to a local path, writing a temporary file beside it and
// renaming it into place so a failed copy leaves nothing half-written.
func (a *app) download(ctx context.Context, c *space.Client, src location, local string) error {
	fi, err := c.Stat(ctx, src.ID, src.Path)
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return fmt.Errorf("%s:%s is a directory (cp copies single files)", src.ID, src.Path)
	}
	rc, err := c.ReadFile(ctx, src.ID, src.Path)
	if err != nil {
		return err
	}
	defer rc.Close()
	if local == "-" {
		_, err := io.Copy(a.stdout, rc)
		return err
	}
	if st, err := os.Stat(local); (err == nil && st.IsDir()) || strings.HasSuffix(local, string(filepath.Separator)) {
		local = filepath.Join(local, path.Base(src.Path))
	}
	tmp, err := os.CreateTemp(filepath.Dir(local), "."+filepath.Base(local)+".space-cp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // no-op after a successful rename
	if _, err := io.Copy(tmp, rc); err != nil {
		tmp.Close()
		return fmt.Errorf("copy %s:%s: %w", src.ID, src.Path, err)
	}
	// The mode of the file itself: a link's (0777, from the sandbox's
	// lstat) would make the copy of its target world-writable; the temp
	// file's 0600 is kept then.
	if mode := fs.FileMode(fi.Mode) & fs.ModePerm; mode != 0 && fi.Type == space.FileTypeFile {
		if err := tmp.Chmod(mode); err != nil {
			tmp.Close()
			return err
		}
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), local)
}

func (a *app) lsCommand() *cobra.Command {
	var (
		depth int
		long  bool
	)
	cmd := &cobra.Command{
		Use:   "ls <id>[:/path]",
		Short: "List a directory in a sandbox",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			loc, err := parseLocation(args[0])
			if err != nil {
				return err
			}
			if !loc.remote() { // a bare id
				loc = location{ID: args[0], Path: "/"}
			}
			c, err := a.sdk()
			if err != nil {
				return err
			}
			ents, err := c.ListFiles(cmd.Context(), loc.ID, loc.Path, depth)
			if err != nil {
				return err
			}
			name := func(e space.FileInfo) string {
				n := e.Name
				if depth > 1 && e.Path != "" {
					if rel, ok := strings.CutPrefix(e.Path, strings.TrimSuffix(loc.Path, "/")+"/"); ok {
						n = rel
					}
				}
				if e.IsDir() {
					n += "/"
				}
				return n
			}
			if !long {
				for _, e := range ents {
					fmt.Fprintln(a.stdout, name(e))
				}
				return nil
			}
			tw := newTable(a.stdout, "MODE", "OWNER", "SIZE", "MODIFIED", "NAME")
			for _, e := range ents {
				n := name(e)
				if e.Target != "" {
					n += " -> " + e.Target
				}
				row(tw, fileMode(e).String(), firstNonEmpty(e.Owner, "-"), strconv.FormatInt(e.Size, 10), fmtTime(e.MTime), n)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().IntVar(&depth, "depth", 1, "levels to descend")
	cmd.Flags().BoolVarP(&long, "long", "l", false, "long listing: mode, owner, size, time")
	return cmd
}

func fileMode(e space.FileInfo) fs.FileMode {
	m := fs.FileMode(e.Mode) & fs.ModePerm
	switch e.Type {
	case space.FileTypeDir:
		m |= fs.ModeDir
	case space.FileTypeSymlink:
		m |= fs.ModeSymlink
	case space.FileTypeOther:
		m |= fs.ModeIrregular
	}
	return m
}
