package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spacesandbox/space/internal/driver"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/snapshot"
	"github.com/spacesandbox/space/internal/store"
)

// Snapshot kinds.
const (
	KindCheckpoint = "checkpoint" // memory, processes and the writable layer (driver image)
	KindFiles      = "files"      // the writable layer only, taken without stopping
)

// filesSuffix names the writable-layer manifest stored beside a
// checkpoint's image manifest.
const filesSuffix = ".files"

// Snapshots is the snapshot part of the service's configuration.
type Snapshots struct {
	Store *snapshot.Store
	// Interval between automatic files snapshots of a running sandbox
	// that changed (0: default 5 min; negative: off).
	Interval time.Duration
	// OnExec is the default of a create's snapshot_on_exec (execsnap.go).
	OnExec bool
	// CheckpointOnPause records a checkpoint in the timeline on every pause.
	CheckpointOnPause bool
	Retention         snapshot.Policy
}

// SetSnapshots enables snapshots on the service.
func (s *Service) SetSnapshots(cfg Snapshots) {
	if cfg.Interval == 0 {
		cfg.Interval = 5 * time.Minute
	}
	s.snaps = &cfg
}

func newSnapshotID() string {
	b := make([]byte, 10)
	rand.Read(b)
	return "snap-" + idEnc.EncodeToString(b)
}

// SnapshotRequest asks for a snapshot.
type SnapshotRequest struct {
	Kind string `json:"kind"`
	Name string `json:"name"`
}

// Snapshot takes a snapshot of a running sandbox.
func (s *Service) Snapshot(ctx context.Context, c Caller, id string, req SnapshotRequest) (store.Snapshot, error) {
	if s.snaps == nil {
		return store.Snapshot{}, errdefs.NotSupported("snapshots are not enabled on this server")
	}
	if req.Kind == "" {
		req.Kind = KindCheckpoint
	}
	if req.Kind != KindCheckpoint && req.Kind != KindFiles {
		return store.Snapshot{}, errdefs.InvalidArgument("kind: must be checkpoint or files")
	}
	if req.Name != "" && !nameRE.MatchString(req.Name) {
		return store.Snapshot{}, errdefs.InvalidArgument("name: lowercase letters, digits, '.', '_', '-' (at most 64)")
	}
	sb, l, err := s.liveOf(ctx, c, id, StateRunning)
	if err != nil {
		return store.Snapshot{}, err
	}
	l.lockOp()
	defer l.opMu.Unlock()
	return s.takeSnapshot(context.WithoutCancel(ctx), sb, req.Kind, req.Name, false)
}

// takeSnapshot records and stores one snapshot; the caller holds the
// sandbox's opMu. A failure leaves a record with status failed and no
// manifest.
func (s *Service) takeSnapshot(ctx context.Context, sb store.Sandbox, kind, name string, automatic bool) (store.Snapshot, error) {
	return s.takeSnapshotCause(ctx, sb, kind, name, automatic, snapCause{})
}

// takeSnapshotCause is takeSnapshot of a snapshot taken after a command.
func (s *Service) takeSnapshotCause(ctx context.Context, sb store.Sandbox, kind, name string, automatic bool, cause snapCause) (store.Snapshot, error) {
	s.mu.Lock()
	l := s.live[sb.ID]
	s.mu.Unlock()
	if l == nil {
		return store.Snapshot{}, errdefs.Unavailable("sandbox %s is not attached", sb.ID)
	}
	if _, ok := l.inst.(driver.UpperExporter); ok {
		if err := s.checkExport(ctx, sb, l); err != nil {
			return store.Snapshot{}, err
		}
	}
	p, err := s.beginSnapshot(ctx, sb, l, kind, name, automatic, cause)
	if err != nil {
		return store.Snapshot{}, err
	}
	return p.finish(ctx)
}

// pendingSnapshot is a snapshot whose record is written (status creating)
// and whose content is yet to be stored: finish stores it, fail records
// why it was not. It holds the team's snapshot lock until then.
type pendingSnapshot struct {
	s      *Service
	sb     store.Sandbox
	rec    store.Snapshot
	exp    driver.UpperExporter // nil: the driver has no file-level view
	cp     driver.Checkpointer  // set for a checkpoint
	unlock func()
}

// beginSnapshot checks that a snapshot of sb may be taken and records it
// as creating. It asks the guest nothing (a pause's checkpoint begins
// once the sandbox is frozen): checkExport is the caller's, beforehand.
func (s *Service) beginSnapshot(ctx context.Context, sb store.Sandbox, l *live, kind, name string, automatic bool, cause snapCause) (*pendingSnapshot, error) {
	// A driver that cannot export its writable layer (a VM's disk is one
	// qcow2 image) still checkpoints; such checkpoints restore and fork
	// but have no file-level view.
	exp, canExport := l.inst.(driver.UpperExporter)
	if kind == KindFiles && !canExport {
		return nil, errdefs.NotSupported("driver %s cannot export its filesystem for a files snapshot", sb.Driver)
	}
	var cp driver.Checkpointer
	if kind == KindCheckpoint {
		var ok bool
		if cp, ok = l.inst.(driver.Checkpointer); !ok {
			return nil, errdefs.NotSupported("driver %s cannot checkpoint", sb.Driver)
		}
	}
	p := &pendingSnapshot{s: s, sb: sb, exp: exp, cp: cp, unlock: func() {}}
	if m := s.teamSnapshotLock(ctx, sb.Team); m != nil {
		m.Lock()
		p.unlock = m.Unlock
	}
	if err := s.snapshotRoom(ctx, sb.Team); err != nil {
		p.unlock()
		if automatic {
			s.log.Warn("automatic snapshot skipped", "sandbox", sb.ID, "kind", kind, "err", err)
		}
		return nil, err
	}
	parent := ""
	if prev, err := s.store.ListSnapshots(ctx, sb.ID, store.SnapshotReady); err == nil && len(prev) > 0 {
		parent = prev[len(prev)-1].ID
	}
	p.rec = store.Snapshot{
		ID: newSnapshotID(), SandboxID: sb.ID, Team: sb.Team, Kind: kind, Name: name, Parent: parent,
		Template: sb.Template, TemplateDigest: sb.TemplateDigest, Automatic: automatic,
		Status: store.SnapshotCreating, CreatedAt: s.now().UTC(), RetentionDays: sb.RetentionDays,
		CommandSeq: cause.seq, Cause: cause.text,
	}
	if err := s.store.CreateSnapshot(ctx, p.rec); err != nil {
		p.unlock()
		return nil, err
	}
	return p, nil
}

// fail records why the snapshot was not taken and drops what was stored.
func (p *pendingSnapshot) fail(ctx context.Context, err error) (store.Snapshot, error) {
	defer p.unlock()
	s, rec := p.s, p.rec
	_ = s.snaps.Store.Delete(rec.ID)
	_ = s.snaps.Store.Delete(rec.ID + filesSuffix)
	_ = s.store.FinishSnapshot(context.WithoutCancel(ctx), rec.ID, store.SnapshotFailed, err.Error(), 0, 0)
	s.log.Warn("snapshot failed", "sandbox", p.sb.ID, "snapshot", rec.ID, "err", err)
	rec.Status, rec.Error = store.SnapshotFailed, err.Error()
	return rec, err
}

// finish stores the snapshot's content and marks it ready.
func (p *pendingSnapshot) finish(ctx context.Context) (store.Snapshot, error) {
	s, sb, rec := p.s, p.sb, p.rec
	meta := snapshot.Meta{Kind: snapshot.KindFiles, Parent: rec.Parent, Name: rec.Name, CreatedAt: rec.CreatedAt,
		Labels: map[string]string{"sandbox": sb.ID, "template_digest": sb.TemplateDigest}, Scope: dedupScope(sb.Team)}
	var bytesNew, bytesTotal int64
	if p.exp != nil {
		// The writable layer, streamed from the driver straight into
		// the chunk store.
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(p.exp.ExportUpper(ctx, pw)) }()
		filesID := rec.ID
		if rec.Kind == KindCheckpoint {
			filesID = rec.ID + filesSuffix
		}
		fm, err := s.snaps.Store.PutTar(ctx, filesID, pr, meta)
		pr.CloseWithError(err)
		if err != nil {
			return p.fail(ctx, fmt.Errorf("store writable layer: %w", err))
		}
		bytesNew, bytesTotal = fm.BytesNew, fm.BytesTotal
	}
	if rec.Kind == KindCheckpoint {
		dir, err := os.MkdirTemp(s.tmpDir(), "checkpoint-")
		if err != nil {
			return p.fail(ctx, err)
		}
		defer os.RemoveAll(dir)
		if err := p.cp.Checkpoint(ctx, dir, true); err != nil {
			return p.fail(ctx, fmt.Errorf("checkpoint: %v: %w", err, errdefs.ErrUnavailable))
		}
		meta.Kind = snapshot.KindCheckpoint
		meta.Labels = maps.Clone(meta.Labels)
		maps.Copy(meta.Labels, machineLabels(sb))
		cm, err := s.snaps.Store.PutDir(ctx, rec.ID, dir, meta)
		if err != nil {
			return p.fail(ctx, fmt.Errorf("store checkpoint image: %w", err))
		}
		bytesNew += cm.BytesNew
		bytesTotal += cm.BytesTotal
	}
	if err := s.store.FinishSnapshot(ctx, rec.ID, store.SnapshotReady, "", bytesNew, bytesTotal); err != nil {
		// Its manifests must not outlive the record: nothing else would
		// ever remove them, and GC keeps every chunk they name.
		return p.fail(ctx, fmt.Errorf("record snapshot: %w", err))
	}
	p.unlock()
	rec.Status, rec.BytesNew, rec.BytesTotal = store.SnapshotReady, bytesNew, bytesTotal
	if p.exp != nil { // a snapshot with a file-level view
		s.prepareTemplateView(sb.Template, sb.TemplateDigest)
	}
	s.log.Info("snapshot taken", "sandbox", sb.ID, "snapshot", rec.ID, "kind", rec.Kind, "bytes_new", bytesNew, "bytes_total", bytesTotal, "automatic", rec.Automatic)
	return rec, nil
}

func (s *Service) tmpDir() string {
	d := filepath.Join(s.cfg.DataDir, "tmp")
	os.MkdirAll(d, 0o700)
	return d
}

// Snapshots lists a sandbox's timeline, oldest first.
func (s *Service) Snapshots(ctx context.Context, c Caller, id string) ([]store.Snapshot, error) {
	if _, err := s.get(ctx, c, id); err != nil {
		// The sandbox record may be gone while its snapshots live on.
		if !errors.Is(err, errdefs.ErrNotFound) {
			return nil, err
		}
		snaps, lerr := s.store.ListSnapshots(ctx, id, "")
		if lerr != nil || len(snaps) == 0 || !c.ownsSnapshot(snaps[0]) {
			return nil, err
		}
		return snaps, nil
	}
	return s.store.ListSnapshots(ctx, id, "")
}

func (c Caller) ownsSnapshot(sn store.Snapshot) bool { return c.Admin || sn.Team == c.Team }

// GetSnapshot returns one snapshot the caller owns.
func (s *Service) GetSnapshot(ctx context.Context, c Caller, sid string) (store.Snapshot, error) {
	if !strings.HasPrefix(sid, "snap-") || len(sid) > 64 {
		return store.Snapshot{}, errdefs.NotFound("snapshot %q not found", sid)
	}
	sn, err := s.store.GetSnapshot(ctx, sid)
	if err != nil {
		return sn, err
	}
	if !c.ownsSnapshot(sn) {
		return store.Snapshot{}, errdefs.NotFound("snapshot %q not found", sid)
	}
	return sn, nil
}

func (s *Service) readySnapshot(ctx context.Context, c Caller, sid string) (store.Snapshot, error) {
	sn, err := s.GetSnapshot(ctx, c, sid)
	if err != nil {
		return sn, err
	}
	if sn.Status != store.SnapshotReady {
		return sn, errdefs.Conflict("snapshot %s is %s", sid, sn.Status)
	}
	return sn, nil
}

// DeleteSnapshot removes a snapshot; its chunks are freed by the next GC
// unless other snapshots share them.
func (s *Service) DeleteSnapshot(ctx context.Context, c Caller, sid string) error {
	sn, err := s.GetSnapshot(ctx, c, sid)
	if err != nil {
		return err
	}
	if sn.Status == store.SnapshotCreating {
		// Its manifests are not written yet: deleting the record now
		// would leave them on disk, unaccounted, for good.
		return errdefs.Conflict("snapshot %s is still being taken; delete it once it is ready or failed", sid)
	}
	return s.dropSnapshot(ctx, sn)
}

// pinSnapshot keeps snapshot id's manifests, and so its chunks (GC keeps
// those of every manifest on disk), until the returned func is called:
// dropSnapshot refuses a pinned snapshot. What reads a snapshot's content
// over time holds a pin (materialize, restore, a file read, verify):
// retention or a delete and the GC after it removed chunks from under a
// fork ("snapshot data corrupt") or left a restore half done.
func (s *Service) pinSnapshot(id string) (unpin func()) {
	s.pinMu.Lock()
	if s.pins == nil {
		s.pins = map[string]int{}
	}
	s.pins[id]++
	s.pinMu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.pinMu.Lock()
			if s.pins[id]--; s.pins[id] <= 0 {
				delete(s.pins, id)
			}
			s.pinMu.Unlock()
		})
	}
}

// dropSnapshot removes a snapshot's manifests and record, unless an
// operation reading it holds a pin (a conflict: retention tries again on
// its next pass).
func (s *Service) dropSnapshot(ctx context.Context, sn store.Snapshot) error {
	s.pinMu.Lock()
	defer s.pinMu.Unlock()
	if s.pins[sn.ID] > 0 {
		return errdefs.Conflict("snapshot %s is being read (a fork, restore or download from it); try again when it ends", sn.ID)
	}
	for _, id := range []string{sn.ID, sn.ID + filesSuffix} {
		if err := s.snaps.Store.Delete(id); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return err
		}
	}
	return s.store.DeleteSnapshot(ctx, sn.ID)
}

// dedupScope is the chunk store's dedup scope of a team's snapshots: a
// team's snapshot dedups against its own data and the templates', never
// against another team's, so its bytes_new reveals nothing about what
// other teams stored.
func dedupScope(team string) string { return "team/" + team }

// templateView returns the manifest of a template's root filesystem,
// ingesting it into the chunk store the first time any snapshot of that
// template needs a full view (every sandbox of the template then shares
// those chunks).
func (s *Service) templateView(ctx context.Context, name, digest string) (*snapshot.Manifest, error) {
	id := "tpl-" + digest
	if m, err := s.snaps.Store.Open(id); err == nil {
		return m, nil
	}
	s.tplMu.Lock()
	defer s.tplMu.Unlock()
	if m, err := s.snaps.Store.Open(id); err == nil {
		return m, nil
	}
	tpl, err := s.store.GetTemplate(ctx, name)
	if err != nil || tpl.Digest != digest {
		return nil, errdefs.Unavailable("template %s (%s) is no longer available for a full view", name, digest[:min(12, len(digest))])
	}
	start := s.now()
	// Shared scope: a template is not one team's, and every team's views
	// dedup against it.
	m, err := s.snaps.Store.PutDir(ctx, id, tpl.Path, snapshot.Meta{Kind: snapshot.KindFiles, Labels: map[string]string{"template": name}, Scope: snapshot.SharedScope})
	if err != nil {
		return nil, err
	}
	s.log.Info("template indexed for snapshots", "template", name, "bytes", m.BytesTotal, "ms", s.now().Sub(start).Milliseconds())
	return m, nil
}

// prepareTemplateView indexes a template for full views in the
// background the first time one of its sandboxes is snapshotted, so that
// the first restore, file history or diff of this data directory does not
// wait for it (base: ~6 s here). Once per template digest and server
// process (a view already stored is found at once); Shutdown stops it.
func (s *Service) prepareTemplateView(name, digest string) {
	if digest == "" {
		return
	}
	if _, started := s.tplIndexing.LoadOrStore(digest, true); started {
		return
	}
	s.background(func() {
		if _, err := s.templateView(s.bg, name, digest); err != nil {
			s.tplIndexing.Delete(digest) // the next snapshot tries again
			s.log.Debug("template not indexed in the background", "template", name, "err", err)
		}
	})
}

// view returns the full filesystem of a snapshot: its writable layer over
// its template.
func (s *Service) view(ctx context.Context, sn store.Snapshot) (*snapshot.Manifest, error) {
	filesID := sn.ID
	if sn.Kind == KindCheckpoint {
		filesID = sn.ID + filesSuffix
	}
	upper, err := s.snaps.Store.Open(filesID)
	if errors.Is(err, errdefs.ErrNotFound) && sn.Kind == KindCheckpoint {
		return nil, errdefs.NotSupported("snapshot %s was taken by a driver without a file-level view (a VM checkpoint)", sn.ID)
	}
	if err != nil {
		return nil, err
	}
	base, err := s.templateView(ctx, sn.Template, sn.TemplateDigest)
	if err != nil {
		return nil, err
	}
	return snapshot.Merge(base, upper), nil
}

// SnapshotFile is one file or directory listing read from a snapshot.
type SnapshotFile struct {
	Entry   snapshot.FileEntry
	Content io.ReadCloser        // for a file
	List    []snapshot.FileEntry // for a directory
}

// ReadSnapshotPath reads a file, or lists a directory, of a snapshot.
func (s *Service) ReadSnapshotPath(ctx context.Context, c Caller, sid, p string) (SnapshotFile, error) {
	p, err := cleanPath(p)
	if err != nil {
		return SnapshotFile{}, err
	}
	unpin := s.pinSnapshot(sid)
	pinned := false // until the content is read (pinnedReader)
	defer func() {
		if !pinned {
			unpin()
		}
	}()
	sn, err := s.readySnapshot(ctx, c, sid)
	if err != nil {
		return SnapshotFile{}, err
	}
	m, err := s.view(ctx, sn)
	if err != nil {
		return SnapshotFile{}, err
	}
	rel := strings.TrimPrefix(p, "/")
	if rel == "" {
		return SnapshotFile{Entry: snapshot.FileEntry{Path: "", Type: snapshot.TypeDir}, List: snapshot.ListDir(m, "")}, nil
	}
	e, ok := m.Lookup(rel)
	if !ok {
		return SnapshotFile{}, errdefs.NotFound("%s not found in snapshot %s", p, sid)
	}
	if e.IsDir() {
		return SnapshotFile{Entry: e, List: snapshot.ListDir(m, rel)}, nil
	}
	rc, e, err := s.snaps.Store.ReadFile(ctx, m, rel)
	if err != nil {
		return SnapshotFile{}, err
	}
	pinned = true
	return SnapshotFile{Entry: e, Content: pinnedReader{rc, unpin}}, nil
}

// pinnedReader releases a snapshot's pin when its content is closed.
type pinnedReader struct {
	io.ReadCloser
	unpin func()
}

func (r pinnedReader) Close() error {
	defer r.unpin()
	return r.ReadCloser.Close()
}

// DiffSnapshots lists what changed between two snapshots of the caller.
func (s *Service) DiffSnapshots(ctx context.Context, c Caller, from, to string) ([]snapshot.Change, error) {
	a, err := s.readySnapshot(ctx, c, from)
	if err != nil {
		return nil, err
	}
	b, err := s.readySnapshot(ctx, c, to)
	if err != nil {
		return nil, err
	}
	ma, err := s.view(ctx, a)
	if err != nil {
		return nil, err
	}
	mb, err := s.view(ctx, b)
	if err != nil {
		return nil, err
	}
	return snapshot.Diff(ma, mb), nil
}

// VerifySnapshot re-hashes every chunk of a snapshot.
func (s *Service) VerifySnapshot(ctx context.Context, c Caller, sid string) error {
	defer s.pinSnapshot(sid)()
	sn, err := s.readySnapshot(ctx, c, sid)
	if err != nil {
		return err
	}
	ids := []string{sn.ID}
	if sn.Kind == KindCheckpoint {
		// A VM checkpoint has no writable-layer part (see takeSnapshot).
		if _, err := s.snaps.Store.Open(sn.ID + filesSuffix); !errors.Is(err, errdefs.ErrNotFound) {
			ids = append(ids, sn.ID+filesSuffix)
		}
	}
	for _, id := range ids {
		if err := s.snaps.Store.Verify(ctx, id); err != nil {
			return err
		}
	}
	return nil
}

// machineLabels are what a checkpoint's manifest records of its sandbox's
// machine, so that it restores as that machine after the sandbox's record
// is gone (stopped records go after a day, checkpoints live for a week):
// a VM driver restores the checkpoint's own machine whatever it is told,
// so a guessed shape would admit a 16 GiB VM as 512 MiB.
func machineLabels(sb store.Sandbox) map[string]string {
	l := map[string]string{
		labelDriver:   sb.Driver,
		labelCPU:      strconv.Itoa(sb.CPU),
		labelMemoryMB: strconv.Itoa(sb.MemoryMB),
		labelDiskMB:   strconv.Itoa(sb.DiskMB),
	}
	if len(sb.Env) > 0 {
		b, _ := json.Marshal(sb.Env)
		l[labelEnv] = string(b)
	}
	return l
}

const (
	labelDriver   = "driver"
	labelCPU      = "cpu"
	labelMemoryMB = "memory_mb"
	labelDiskMB   = "disk_mb"
	labelEnv      = "env"
)

// checkpointParent rebuilds the sandbox a checkpoint was taken of from
// its manifest's machine labels, when that sandbox's record is gone.
func (s *Service) checkpointParent(sn store.Snapshot) (store.Sandbox, error) {
	m, err := s.snaps.Store.Open(sn.ID)
	if err != nil {
		return store.Sandbox{}, err
	}
	l := m.Labels
	cpu, cerr := strconv.Atoi(l[labelCPU])
	mem, merr := strconv.Atoi(l[labelMemoryMB])
	if l[labelDriver] == "" || cerr != nil || merr != nil || cpu <= 0 || mem <= 0 {
		// Taken by a server before the labels: its machine is unknown.
		return store.Sandbox{}, errdefs.Unavailable("checkpoint %s does not record its machine and its sandbox %s is gone; it cannot be restored", sn.ID, sn.SandboxID)
	}
	parent := store.Sandbox{ID: sn.SandboxID, Team: sn.Team, Template: sn.Template, TemplateDigest: sn.TemplateDigest,
		Driver: l[labelDriver], CPU: cpu, MemoryMB: mem, DiskMB: DefaultDiskMB, Env: map[string]string{},
		TimeoutS: int(s.cfg.DefaultTimeout.Seconds()), OnTimeout: "kill"}
	if d, err := strconv.Atoi(l[labelDiskMB]); err == nil && d > 0 {
		parent.DiskMB = d // a checkpoint from before the label: the 10 GiB of then
	}
	if e := l[labelEnv]; e != "" {
		if err := json.Unmarshal([]byte(e), &parent.Env); err != nil {
			return store.Sandbox{}, fmt.Errorf("checkpoint %s: env label: %w", sn.ID, err)
		}
	}
	return parent, nil
}
