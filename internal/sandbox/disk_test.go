package sandbox

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spacesandbox/space/internal/driver"
	"github.com/spacesandbox/space/internal/driver/gvisor"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/testenv"
)

// TestValidateDiskMB: a create's disk_mb is 0 (the default, 10240 MiB, or
// the server's smaller maximum) or between MinDiskMB and the server's
// MaxDiskMB; anything else is a 400 naming disk_mb. A pooled sandbox has
// the default disk, so only a create of that disk is served from a pool.
func TestValidateDiskMB(t *testing.T) {
	d, err := gvisor.New(context.Background(), gvisor.Config{Runsc: testenv.Runsc(t), Root: filepath.Join(t.TempDir(), "runsc"), Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		max, disk, want int // want 0: refused
	}{
		{0, 0, DefaultDiskMB},
		{0, MinDiskMB, MinDiskMB},
		{0, 2048, 2048},
		{0, DefaultDiskMB, DefaultDiskMB},
		{0, DefaultDiskMB + 1, 0},
		{0, MinDiskMB - 1, 0},
		{0, 1, 0},
		{0, -1, 0},
		{4096, 0, 4096},
		{4096, 4097, 0},
		{20480, 20480, 20480},
	} {
		svc := New(Config{DataDir: t.TempDir(), DefaultDriver: gvisor.Name, DefaultTemplate: "base", MaxDiskMB: tc.max}, nil, []driver.Driver{d}, slog.New(slog.DiscardHandler), nil)
		req := CreateRequest{DiskMB: tc.disk}
		err := svc.validateCreate(&req)
		switch {
		case tc.want == 0 && (!errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "disk_mb")):
			t.Errorf("max %d, disk_mb %d: %v, want a 400 naming disk_mb", tc.max, tc.disk, err)
		case tc.want != 0 && (err != nil || req.DiskMB != tc.want):
			t.Errorf("max %d, disk_mb %d: %v, disk %d, want %d", tc.max, tc.disk, err, req.DiskMB, tc.want)
		}
		if tc.disk == 0 && tc.want != 0 && svc.poolDiskMB() != tc.want {
			t.Errorf("max %d: pooled sandboxes get %d MiB of disk, a default create %d", tc.max, svc.poolDiskMB(), tc.want)
		}
	}
}
