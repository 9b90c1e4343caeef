package server

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/store"
	"github.com/spacesandbox/space/internal/template"
	"github.com/spacesandbox/space/internal/vmimage"
)

// Template builds (a rootfs of 0.3–1.4 GB, and a VM root image of each)
// piled up in the cache with every recipe change. A build goes once no
// record of this server needs it (store.TemplateDigestsInUse), it is not a
// built-in recipe's, and no server sharing the cache touched it for
// templateIdle: every server touches what its records need every
// pruneEvery, so another server's builds stay while it runs.
const (
	templateIdle = 8 * 24 * time.Hour // past the default snapshot retention
	pruneEvery   = 6 * time.Hour
	pruneFirst   = 10 * time.Minute
)

// pruneTemplates runs pruneTemplatesOnce every pruneEvery until ctx ends.
func pruneTemplates(ctx context.Context, st *store.Store, b *template.Builder, vmCache string, log *slog.Logger) {
	wait := pruneFirst
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = pruneEvery
		if err := pruneTemplatesOnce(ctx, st, b, vmCache, time.Now(), log); err != nil && ctx.Err() == nil {
			log.Warn("template cache cleanup", "err", err)
		}
	}
}

// pruneTemplatesOnce touches the builds this server needs and removes the
// ones nobody needs (template builds and VM root images).
func pruneTemplatesOnce(ctx context.Context, st *store.Store, b *template.Builder, vmCache string, now time.Time, log *slog.Logger) error {
	inUse, err := st.TemplateDigestsInUse(ctx)
	if err != nil {
		return err
	}
	for _, r := range template.Builtins() {
		inUse[r.Digest()] = true
	}
	var errs []error
	for d := range inUse {
		if _, err := b.Lookup(d); err == nil {
			if err := b.Touch(d); err != nil {
				errs = append(errs, err)
			}
		}
	}
	keep := func(d string) bool { return inUse[d] }
	removed, err := b.Prune(keep, templateIdle, now)
	if err != nil {
		errs = append(errs, err)
	}
	if len(removed) > 0 {
		log.Info("removed template builds no sandbox, snapshot or template uses", "count", len(removed), "digests", removed)
	}
	// VM root images go with their build, or once it is gone and they
	// were not made for templateIdle.
	imgs, err := vmimage.RootImageDigests(vmCache)
	if err != nil {
		errs = append(errs, err)
	}
	for d, made := range imgs {
		if inUse[d] || now.Sub(made) < templateIdle {
			continue
		}
		if _, err := b.Lookup(d); !errors.Is(err, errdefs.ErrNotFound) {
			continue
		}
		if ok, err := vmimage.RemoveRootImages(vmCache, d); err != nil {
			errs = append(errs, err)
		} else if ok {
			log.Info("removed VM root image of a removed template build", "digest", d)
		}
	}
	return errors.Join(errs...)
}
