package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"

	"github.com/spacesandbox/space/internal/agentclient"
	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/driver"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/snapshot"
	"github.com/spacesandbox/space/internal/store"
)

// RestoreResult says what a restore changed in the live sandbox.
type RestoreResult struct {
	Snapshot string   `json:"snapshot"` // what the files were restored from
	Written  []string `json:"written"`
	Removed  []string `json:"removed"`
}

// maxRestorePaths bounds the paths of one restore.
const maxRestorePaths = 1000

// RestoreFiles brings the chosen paths (every path when paths is empty)
// of a running sandbox back to how they were in snapshot sid: files and
// directories that differ are rewritten, ones that did not exist then are
// removed. Other paths are left as they are.
func (s *Service) RestoreFiles(ctx context.Context, c Caller, id, sid string, paths []string) (RestoreResult, error) {
	res := RestoreResult{Snapshot: sid}
	if s.snaps == nil {
		return res, errdefs.NotSupported("snapshots are not enabled on this server")
	}
	if len(paths) > maxRestorePaths {
		// Each is matched against every changed path, with the
		// sandbox's lifecycle lock held.
		return res, errdefs.InvalidArgument("paths: at most %d (restore a common directory instead)", maxRestorePaths)
	}
	var sel []string
	for _, p := range paths {
		cp, err := cleanPath(p)
		if err != nil {
			return res, err
		}
		if cp == "/" {
			sel = nil
			break
		}
		sel = append(sel, strings.TrimPrefix(cp, "/"))
	}
	sb, l, err := s.liveOf(ctx, c, id, StateRunning)
	if err != nil {
		return res, err
	}
	defer s.pinSnapshot(sid)()
	sn, err := s.readySnapshot(ctx, c, sid)
	if err != nil {
		return res, err
	}
	if sn.TemplateDigest != sb.TemplateDigest {
		return res, errdefs.InvalidArgument("snapshot %s is of template %s, sandbox %s runs %s", sid, sn.Template, id, sb.Template)
	}
	ctx = context.WithoutCancel(ctx)
	if err := checkRestoreAgent(ctx, l.agent); err != nil {
		return res, err
	}
	l.lockOp()
	defer l.opMu.Unlock()
	target, err := s.view(ctx, sn)
	if err != nil {
		return res, err
	}
	// The sandbox as it is now: its writable layer, over the template.
	exp, ok := l.inst.(driver.UpperExporter)
	if !ok {
		return res, errdefs.NotSupported("driver %s cannot export its filesystem", sb.Driver)
	}
	if err := s.checkExport(ctx, sb, l); err != nil {
		return res, err
	}
	curID := "tmp-" + newSnapshotID()
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(exp.ExportUpper(ctx, pw)) }()
	upper, err := s.snaps.Store.PutTar(ctx, curID, pr, snapshot.Meta{Scope: dedupScope(sb.Team)})
	pr.CloseWithError(err)
	if err != nil {
		return res, err
	}
	defer s.snaps.Store.Delete(curID)
	base, err := s.templateView(ctx, sb.Template, sb.TemplateDigest)
	if err != nil {
		return res, err
	}
	current := snapshot.Merge(base, upper)
	selected := func(p string) bool {
		if internalPath(p) {
			return false
		}
		if len(sel) == 0 {
			return true
		}
		for _, q := range sel {
			if p == q || strings.HasPrefix(p, q+"/") {
				return true
			}
		}
		return false
	}
	// gone holds the paths whose whole tree this restore removed: what
	// the diff says about paths under them is already done, and nothing
	// is sent through what may stand there now (a link the snapshot has
	// where a directory is: its old children's removals would go through
	// it). The removals do not follow links either (RemoveNoFollow).
	gone := map[string]bool{}
	under := func(p string) bool {
		for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
			if gone[d] {
				return true
			}
		}
		return false
	}
	for _, ch := range snapshot.Diff(current, target) {
		if !selected(ch.Path) {
			continue
		}
		abs := "/" + ch.Path
		if ch.Kind == snapshot.Removed {
			if under(ch.Path) {
				continue
			}
			if err := l.agent.RemoveNoFollow(ctx, abs, true); err != nil && !isNotFound(err) {
				return res, fmt.Errorf("remove %s: %w", abs, err)
			}
			gone[ch.Path] = true
			res.Removed = append(res.Removed, abs)
			continue
		}
		e, _ := target.Lookup(ch.Path)
		if cur, ok := current.Lookup(ch.Path); ok && kindOf(cur.Type) != kindOf(e.Type) {
			// A link where the snapshot has a directory (or any other
			// change of kind) goes first: nothing is written through it.
			if err := l.agent.RemoveNoFollow(ctx, abs, true); err != nil && !isNotFound(err) {
				return res, fmt.Errorf("replace %s: %w", abs, err)
			}
			gone[ch.Path] = true
		}
		if err := s.writeEntry(ctx, l.agent, target, e); err != nil {
			return res, fmt.Errorf("restore %s: %w", abs, err)
		}
		res.Written = append(res.Written, abs)
	}
	if len(sel) > 0 && len(res.Written)+len(res.Removed) == 0 {
		for _, q := range sel {
			if _, ok := target.Lookup(q); !ok {
				if _, ok := current.Lookup(q); !ok {
					return res, errdefs.NotFound("/%s exists neither in snapshot %s nor in the sandbox", q, sid)
				}
			}
		}
	}
	s.log.Info("files restored", "sandbox", id, "snapshot", sid, "written", len(res.Written), "removed", len(res.Removed))
	return res, nil
}

// caBundle and caLocalPEM are agent.CABundle and agent.CALocalPEM (the
// agent package is guest-side and not imported here).
const (
	caBundle   = "/etc/ssl/certs/ca-certificates.crt"
	caLocalPEM = "/usr/local/share/ca-certificates/space-egress.crt"
)

// internalPath is what a restore leaves alone: the kernel's and the
// platform's own trees, and what the agent installs for the sandbox's
// egress (its CA in the trust store, Node's preload): the snapshot's are
// another sandbox's, or none, and a sandbox made from a snapshot would
// stop trusting its own proxy, or fail to start node at all.
func internalPath(p string) bool {
	for _, pre := range []string{"proc", "sys", "dev", ".space", "tmp/.X11-unix",
		strings.TrimPrefix(caBundle, "/"), strings.TrimPrefix(caLocalPEM, "/"), strings.TrimPrefix(path.Dir(nodePreload), "/")} {
		if p == pre || strings.HasPrefix(p, pre+"/") {
			return true
		}
	}
	return false
}

// agentFiles is what a restore asks of the agent: every write, directory
// and link without following a symbolic link in the path (the sandbox's
// own code can plant one where the snapshot has a directory, and the agent
// writes as root).
type agentFiles interface {
	WriteFileNoFollow(ctx context.Context, path string, r io.Reader, mode os.FileMode, user string) (agentproto.FileInfo, error)
	MkdirNoFollow(ctx context.Context, path, user string) (agentproto.FileInfo, error)
	Symlink(ctx context.Context, path, target, user string) (agentproto.FileInfo, error)
	RemoveNoFollow(ctx context.Context, path string, recursive bool) error
}

// writeEntry recreates one snapshot entry in the sandbox through the agent.
func (s *Service) writeEntry(ctx context.Context, a agentFiles, m *snapshot.Manifest, e snapshot.FileEntry) error {
	abs := "/" + e.Path
	user := "root"
	if e.UID == 1000 {
		user = "user"
	}
	switch e.Type {
	case snapshot.TypeDir, snapshot.TypeOpaque:
		_, err := a.MkdirNoFollow(ctx, abs, user)
		return err
	case snapshot.TypeSymlink:
		_, err := a.Symlink(ctx, abs, e.Link, user)
		return err
	case snapshot.TypeFile, snapshot.TypeHardlink:
		rc, _, err := s.snaps.Store.ReadFile(ctx, m, e.Path)
		if err != nil {
			return err
		}
		defer rc.Close()
		_, err = a.WriteFileNoFollow(ctx, abs, rc, os.FileMode(e.Mode&0o7777), user)
		return err
	default:
		return nil // devices, sockets: not restored
	}
}

// restoreVersion is the first agent protocol whose file writes and
// removals can refuse to follow links (agentproto.Version 8).
const restoreVersion = 8

// checkRestoreAgent refuses a restore on a sandbox whose agent (it keeps
// the one it started with) would follow links planted in its tree.
func checkRestoreAgent(ctx context.Context, a *agentclient.Client) error {
	info, err := a.Info(ctx)
	if err != nil {
		return err
	}
	if v, _ := strconv.Atoi(info.Version); v < restoreVersion {
		return errdefs.NotSupported("this sandbox runs agent protocol %s, which cannot restore files safely; restore into a new sandbox (create from the snapshot)", info.Version)
	}
	return nil
}

func isNotFound(err error) bool { return errorsIs(err, errdefs.ErrNotFound) }

// CreateFromSnapshot makes a new sandbox from a snapshot: a checkpoint is
// restored with its processes; a files snapshot becomes a fresh sandbox of
// its template with the snapshot's files written in.
func (s *Service) createFromSnapshot(ctx context.Context, c Caller, req CreateRequest) (store.Sandbox, error) {
	sn, err := s.readySnapshot(ctx, c, req.Snapshot)
	if err != nil {
		return store.Sandbox{}, err
	}
	if sn.Kind == KindCheckpoint {
		image, _, err := s.materialize(ctx, c, sn.ID)
		if err != nil {
			return store.Sandbox{}, err
		}
		defer os.RemoveAll(image)
		parent, err := s.store.GetSandbox(ctx, sn.SandboxID)
		if errors.Is(err, errdefs.ErrNotFound) {
			// The original sandbox record is gone: rebuild its machine
			// from the checkpoint.
			parent, err = s.checkpointParent(sn)
		}
		if err != nil {
			return store.Sandbox{}, err
		}
		if req.CPU > 0 || req.MemoryMB > 0 || req.DiskMB > 0 {
			return store.Sandbox{}, errdefs.InvalidArgument("cpu, memory_mb and disk_mb cannot change when restoring a checkpoint")
		}
		// A restored checkpoint is the parent's machine: what would be a
		// different one is refused rather than ignored.
		if req.Driver != "" && req.Driver != parent.Driver {
			return store.Sandbox{}, errdefs.InvalidArgument("driver: a checkpoint of driver %s restores with it", parent.Driver)
		}
		if req.Network != nil || len(req.Secrets) > 0 || req.SnapshotIntervalS != 0 || req.RetentionDays != 0 {
			return store.Sandbox{}, errdefs.InvalidArgument("network, secrets, snapshot_interval_s and retention_days cannot be given when restoring a checkpoint (set the network on the new sandbox afterwards)")
		}
		return s.restoreSandbox(ctx, c, parent, image, req)
	}
	req.Template = sn.Template
	req.Snapshot = ""
	sb, err := s.Create(ctx, c, req)
	if err != nil {
		return sb, err
	}
	if sb.TemplateDigest != sn.TemplateDigest {
		_ = s.Kill(context.WithoutCancel(ctx), c, sb.ID)
		return store.Sandbox{}, errdefs.Conflict("template %s was rebuilt since snapshot %s", sn.Template, sn.ID)
	}
	if _, err := s.RestoreFiles(ctx, c, sb.ID, sn.ID, nil); err != nil {
		_ = s.Kill(context.WithoutCancel(ctx), c, sb.ID)
		return store.Sandbox{}, err
	}
	return sb, nil
}

// kindOf groups entry types by what they are on disk: a directory (opaque
// or not), a link, or a file (hardlinks are written as files).
func kindOf(t snapshot.EntryType) string {
	switch t {
	case snapshot.TypeDir, snapshot.TypeOpaque:
		return "dir"
	case snapshot.TypeSymlink:
		return "link"
	}
	return "file"
}
