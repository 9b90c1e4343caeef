package sandbox

// Pool images: where a driver restores faster than it boots (QEMU under
// TCG: ~2.5 s against ~4.5 s), a pool keeps one post-boot checkpoint of its
// shape and refills by restoring it.
//
// The image is made from a sandbox booted for that purpose and never handed
// out: booted, agent answering, before any Init, so it holds no identity,
// env, network endpoint, CA or secret placeholder of anyone. It lives in the
// server's own data dir (<data>/pool-images/<shape>), is rebuilt when it is
// missing, fails its check (sizes, template digest, agent binary) or fails
// a restore, and is removed when the pools stop (and, left by a crash, when
// they start again) or when its template changes or goes away.
//
// A restore clones the guest kernel's RNG state into every sandbox made
// from one image: each restored sandbox gets fresh host entropy and a forced
// CRNG reseed right after the restore and again at its claim (Init with
// Entropy), and the host's clock.
//
// Nothing here may stop a pool: when the image cannot be made or restored,
// the pool refills by cold boots (logged once) and tries the image again
// after a back-off.

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spacesandbox/space/internal/agentclient"
	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/driver"
	"github.com/spacesandbox/space/internal/store"
)

// poolImageMeta is written last into an image dir (image.json): its
// presence marks a complete image, its fields what the image is of.
type poolImageMeta struct {
	Driver   string           `json:"driver"`
	Template string           `json:"template"`
	Digest   string           `json:"digest"`
	CPU      int              `json:"cpu"`
	MemoryMB int              `json:"memory_mb"`
	Agent    fileStamp        `json:"agent"` // the agent binary booted into the image
	Files    map[string]int64 `json:"files"` // every file of the driver's image and its size
	BuiltAt  time.Time        `json:"built_at"`
}

// fileStamp identifies a file's version cheaply.
type fileStamp struct {
	Size    int64     `json:"size"`
	ModTime time.Time `json:"mod_time"`
}

const poolImageMetaFile = "image.json"

// poolImage is one pool's image state; only the pool's filler touches it.
type poolImage struct {
	dir     string
	retryAt time.Time     // no image attempts before this (after failures)
	backoff time.Duration // the next back-off
	cold    bool          // refilling by boots; logged once per episode
}

// Back-off before the image is tried again after a failure.
const (
	poolImageBackoff    = time.Minute
	poolImageBackoffMax = 30 * time.Minute
)

func (s *Service) poolImagesDir() string { return filepath.Join(s.cfg.DataDir, "pool-images") }

// newPoolImage names the image dir of a new pool of shape k: by the shape
// and a number of its own, since a pool of the same shape that was just
// replaced (a prestart or size 0 and back) removes its image in the
// background while this one builds.
func (s *Service) newPoolImage(k shape) *poolImage {
	d := strings.TrimPrefix(k.digest, "sha256:")
	if len(d) > 16 {
		d = d[:16]
	}
	name := fmt.Sprintf("%s-%s-%dc-%dm-%d", k.driver, d, k.cpu, k.memoryMB, s.poolImageSeq.Add(1))
	name = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '_'
	}, name)
	return &poolImage{dir: filepath.Join(s.poolImagesDir(), name), backoff: poolImageBackoff}
}

// refill makes one warm sandbox: from the pool's image when it has one
// (built first if needed), else, and whenever the image fails, by a boot.
func (p *pool) refill(ctx context.Context) (*warm, error) {
	s := p.s
	start := s.now()
	if im := p.img; im != nil && !s.now().Before(im.retryAt) {
		w, stage, err := p.restoreFromImage(ctx)
		if err == nil {
			s.log.Debug("warm pool: refilled", "sandbox", w.sb.ID, "driver", p.shape.driver, "method", "restore", "ms", s.now().Sub(start).Milliseconds())
			if im.cold {
				s.log.Info("warm pool: refilling from its image again", "driver", p.shape.driver, "image", im.dir)
			}
			im.cold, im.backoff = false, poolImageBackoff
			s.poolMetric("restore", p.shape.driver)
			return w, nil
		}
		if errors.Is(err, errTemplateGone) {
			// Refills go on as before (cold); the image has no use.
			p.mu.Lock() // Pools reads it
			p.img = nil
			p.mu.Unlock()
			s.log.Info("warm pool: image removed", "driver", p.shape.driver, "template", p.tpl.Name, "why", err)
		} else {
			s.poolImageEvent(p, stage+"_failed")
			im.retryAt = s.now().Add(im.backoff)
			im.backoff = min(2*im.backoff, poolImageBackoffMax)
			if !im.cold {
				im.cold = true
				s.log.Warn("warm pool: image unusable; refilling by cold boots", "driver", p.shape.driver, "stage", stage, "retry_in", im.retryAt.Sub(s.now()).Round(time.Second), "err", err)
			} else {
				s.log.Debug("warm pool: image still unusable", "driver", p.shape.driver, "stage", stage, "err", err)
			}
		}
		s.removePoolImage(p, im)
	}
	start = s.now()
	w, err := s.bootWarm(ctx, p)
	if err == nil {
		s.log.Debug("warm pool: refilled", "sandbox", w.sb.ID, "driver", p.shape.driver, "method", "boot", "ms", s.now().Sub(start).Milliseconds())
		s.poolMetric("boot", p.shape.driver)
	}
	return w, err
}

var errTemplateGone = errors.New("the pool's template changed or was removed")

// restoreFromImage restores a warm sandbox from the pool's image, building
// the image first when it is missing or stale. stage says what failed:
// "build" or "restore".
func (p *pool) restoreFromImage(ctx context.Context) (*warm, string, error) {
	s := p.s
	tpl, err := s.store.GetTemplate(ctx, p.tpl.Name)
	if err != nil || tpl.Digest != p.tpl.Digest {
		return nil, "build", errTemplateGone
	}
	if err := s.checkPoolImage(p); err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			s.log.Info("warm pool: rebuilding its image", "driver", p.shape.driver, "why", err)
		}
		if err := s.buildPoolImage(ctx, p); err != nil {
			return nil, "build", err
		}
	}
	w, err := s.restoreWarm(ctx, p)
	if err != nil {
		return nil, "restore", err
	}
	return w, "", nil
}

// checkPoolImage verifies that the pool's image is complete and of this
// pool's shape, template and agent: os.ErrNotExist when there is none.
func (s *Service) checkPoolImage(p *pool) error {
	b, err := os.ReadFile(filepath.Join(p.img.dir, poolImageMetaFile))
	if err != nil {
		return err
	}
	var m poolImageMeta
	if err := json.Unmarshal(b, &m); err != nil {
		return fmt.Errorf("%s: %v", poolImageMetaFile, err)
	}
	want, err := s.poolImageMeta(p)
	if err != nil {
		return err
	}
	if m.Driver != want.Driver || m.Digest != want.Digest || m.CPU != want.CPU || m.MemoryMB != want.MemoryMB {
		return fmt.Errorf("image is of another shape or template")
	}
	if !m.Agent.ModTime.Equal(want.Agent.ModTime) || m.Agent.Size != want.Agent.Size {
		return fmt.Errorf("the agent binary changed")
	}
	if len(m.Files) == 0 {
		return fmt.Errorf("image lists no files")
	}
	for name, size := range m.Files {
		fi, err := os.Stat(filepath.Join(p.img.dir, name))
		if err != nil || fi.Size() != size {
			return fmt.Errorf("image file %s is missing or changed", name)
		}
	}
	return nil
}

// poolImageMeta is what an image of pool p must say about itself.
func (s *Service) poolImageMeta(p *pool) (poolImageMeta, error) {
	fi, err := os.Stat(s.cfg.AgentPath)
	if err != nil {
		return poolImageMeta{}, fmt.Errorf("agent binary: %w", err)
	}
	return poolImageMeta{
		Driver: p.shape.driver, Template: p.tpl.Name, Digest: p.tpl.Digest,
		CPU: p.shape.cpu, MemoryMB: p.shape.memoryMB,
		Agent: fileStamp{Size: fi.Size(), ModTime: fi.ModTime().UTC()},
	}, nil
}

// buildPoolImage boots a sandbox of the pool's shape that is never handed
// out, checkpoints it (no Init has run: no identity, env or secret is in
// it) and destroys it. The image appears atomically: written into a temp
// dir, image.json last, then renamed into place.
func (s *Service) buildPoolImage(ctx context.Context, p *pool) (err error) {
	start := s.now()
	meta, err := s.poolImageMeta(p)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(s.poolImagesDir(), 0o700); err != nil {
		return err
	}
	_ = os.RemoveAll(p.img.dir)
	tmp, err := os.MkdirTemp(s.poolImagesDir(), ".tmp-")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
			s.poolImageEvent(p, "build_failed")
		}
	}()
	w, err := s.bootWarm(ctx, p)
	if err != nil {
		return fmt.Errorf("boot: %w", err)
	}
	cp, ok := w.inst.(driver.Checkpointer)
	if !ok {
		s.discardWarm(w)
		return fmt.Errorf("driver %s cannot checkpoint", p.shape.driver)
	}
	err = cp.Checkpoint(ctx, tmp, false)
	s.discardWarm(w)
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	meta.Files = map[string]int64{}
	err = filepath.WalkDir(tmp, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(tmp, path)
		meta.Files[rel] = fi.Size()
		return nil
	})
	if err != nil {
		return err
	}
	meta.BuiltAt = s.now().UTC()
	b, _ := json.MarshalIndent(meta, "", "  ")
	if err := writeSynced(filepath.Join(tmp, poolImageMetaFile), b); err != nil {
		return err
	}
	if err := os.Rename(tmp, p.img.dir); err != nil {
		return err
	}
	s.poolImageEvent(p, "built")
	s.log.Info("warm pool: image built", "driver", p.shape.driver, "template", p.tpl.Name, "image", p.img.dir, "ms", s.now().Sub(start).Milliseconds())
	return nil
}

func writeSynced(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// restoreWarm makes a pooled sandbox from the pool's image: recorded as
// pooled first (a crash leaves a record Recover destroys), restored, then
// given fresh entropy (a forced reseed) and the host's clock, but no
// identity. On error everything it made is gone.
func (s *Service) restoreWarm(ctx context.Context, p *pool) (_ *warm, err error) {
	r, ok := s.drivers[p.shape.driver].(driver.Restorer)
	if !ok {
		return nil, fmt.Errorf("driver %s cannot restore", p.shape.driver)
	}
	sb := s.pooledRecord(p)
	if err := s.store.CreateSandbox(ctx, sb); err != nil {
		return nil, err
	}
	log := s.log.With("sandbox", sb.ID)
	var inst driver.Instance
	var agent *agentclient.Client
	defer func() {
		if err == nil {
			return
		}
		cctx := context.WithoutCancel(ctx)
		if agent != nil {
			agent.Close()
		}
		if inst != nil {
			if derr := inst.Destroy(cctx); derr != nil {
				log.Error("rollback: destroy", "err", derr)
			}
		} else {
			// A failed Restore removes what it made; make sure of the dir.
			_ = os.RemoveAll(s.stateDir(sb.ID))
		}
		if derr := s.store.DeleteSandbox(cctx, sb.ID); derr != nil {
			log.Error("rollback: delete record", "err", derr)
		}
	}()
	rootfs, kind, err := s.rootfs(ctx, sb.Driver, p.tpl)
	if err != nil {
		return nil, err
	}
	spec := driver.Spec{
		ID: sb.ID, Hostname: "sandbox", Rootfs: rootfs, RootfsKind: kind,
		StateDir: s.stateDir(sb.ID), AgentPath: s.cfg.AgentPath,
		VCPU: sb.CPU, MemoryMB: sb.MemoryMB, DiskMB: sb.DiskMB, LowPriority: true,
	}
	// Recorded first: a server that dies during the restore finds (and
	// removes) what it made.
	ph, _ := json.Marshal(driver.StateDirHandle(sb.Driver, spec))
	if err := s.store.SetSandboxHandle(ctx, sb.ID, ph); err != nil {
		return nil, err
	}
	if inst, err = r.Restore(ctx, spec, p.img.dir); err != nil {
		return nil, fmt.Errorf("restore %s: %w", sb.ID, err)
	}
	sb.Handle, _ = json.Marshal(inst.Handle())
	if err := s.store.SetSandboxHandle(ctx, sb.ID, sb.Handle); err != nil {
		return nil, err
	}
	agent = agentclient.New(inst.DialAgent, log)
	ictx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	// No identity yet (SandboxID and Env stay empty): only what makes
	// this clone differ from its siblings at once.
	if err := agent.Init(ictx, agentproto.InitRequest{Time: s.now().UTC(), Entropy: freshEntropy()}); err != nil {
		return nil, fmt.Errorf("restored agent did not answer: %w", err)
	}
	return &warm{sb: sb, inst: inst, agent: agent, restored: true}, nil
}

// freshEntropy is what every claim and restore sends the agent to reseed
// the guest kernel's RNG.
func freshEntropy() []byte {
	b := make([]byte, 64)
	rand.Read(b)
	return b
}

// removePoolImage deletes the pool's image (a later refill rebuilds it).
func (s *Service) removePoolImage(p *pool, im *poolImage) {
	if _, err := os.Stat(im.dir); err != nil {
		return
	}
	if err := os.RemoveAll(im.dir); err != nil {
		s.log.Error("warm pool: remove image", "image", im.dir, "err", err)
		return
	}
	s.poolImageEvent(p, "removed")
}

func (s *Service) poolMetric(method, drv string) {
	if s.metrics != nil {
		s.metrics.PoolRefills.WithLabelValues(drv, method).Inc()
	}
}

func (s *Service) poolImageEvent(p *pool, event string) {
	if s.metrics != nil {
		s.metrics.PoolImage.WithLabelValues(p.shape.driver, event).Inc()
	}
}

// pooledRecord is the record of a new pooled sandbox of pool p.
func (s *Service) pooledRecord(p *pool) store.Sandbox {
	now := s.now().UTC()
	return store.Sandbox{
		ID: newID(), Team: poolTeam, Template: p.tpl.Name, TemplateDigest: p.tpl.Digest,
		Driver: p.shape.driver, State: StatePooled, Env: map[string]string{}, Metadata: map[string]string{},
		CPU: p.shape.cpu, MemoryMB: p.shape.memoryMB, DiskMB: p.shape.diskMB, CreatedAt: now, UpdatedAt: now,
	}
}
