package space_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	space "github.com/spacesandbox/space/sdk/go"
)

func Example() {
	ctx := context.Background()
	c := space.NewClient("http://127.0.0.1:7070", os.Getenv("SPACE_API_KEY"))

	sb, err := c.CreateSandbox(ctx, space.CreateSandboxRequest{Template: "base", TimeoutS: 600})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.KillSandbox(context.WithoutCancel(ctx), sb.ID)

	if _, err := c.WriteFile(ctx, sb.ID, "/work/hello.py", strings.NewReader(`print("hi")`)); err != nil {
		fmt.Println(err)
		return
	}
	s, err := c.ExecStream(ctx, sb.ID, space.ExecRequest{Cmd: []string{"python3", "/work/hello.py"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()
	for {
		ev, err := s.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			fmt.Println(err) // resume with c.Events(ctx, sb.ID, pid, s.LastSeq())
			return
		}
		switch ev.Type {
		case space.EventStdout:
			os.Stdout.Write(ev.Data)
		case space.EventExit:
			fmt.Println("exit", ev.ExitCode)
		}
	}
}
