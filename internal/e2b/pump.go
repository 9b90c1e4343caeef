package e2b

import "context"

// pumped is one result of a blocking Next call.
type pumped[T any] struct {
	v   T
	err error
}

// pump runs next in a goroutine and delivers its results on a channel
// until next fails (the failing result is delivered too) or ctx ends, so a
// handler can select between the stream, keepalives and cancellation.
func pump[T any](ctx context.Context, next func() (T, error), buf int) <-chan pumped[T] {
	ch := make(chan pumped[T], buf)
	go func() {
		defer close(ch)
		for {
			v, err := next()
			select {
			case ch <- pumped[T]{v, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	return ch
}
