package sandbox

import (
	"context"
	"testing"
)

// A command's tag (E2B's process tags and kernels set one) is in the
// history; it was always empty.
func TestCommandsKeepTag(t *testing.T) {
	svc, _, _ := realService(t)
	ctx := context.Background()
	c := Caller{Team: "t"}
	sb, err := svc.Create(ctx, c, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Exec(ctx, c, sb.ID, ExecRequest{Cmd: []string{"true"}, Tag: "my-tag"}); err != nil {
		t.Fatal(err)
	}
	cmds, _, err := svc.Commands(ctx, c, sb.ID, "", 10)
	if err != nil || len(cmds) != 1 || cmds[0].Tag != "my-tag" {
		t.Fatalf("commands %+v, %v; want one tagged my-tag", cmds, err)
	}
}
