// The serving process's one scheduler (issue 15): an io_context run by one thread, on which the
// engine's strand (the step loop), the host tier's strand (io_uring completions, look-ahead,
// promotions) and the device tier's strand (VRAM slots, copy completions) all run, so a router's
// picks, a read's completion and a copy's completion are handled by the same thread as the step
// that waits for them, with no hand-over between scheduler threads. Compute does not run here:
// forwards run on the engine's compute thread and only post their requests and resumptions.
//
// The model session makes it before the tiers (they take its executor) and it stops after the
// engine and the tiers are gone: its destructor lets every handler posted until then run (the
// tiers' destructors drain their completions through their strands), then joins.
//
// Whatever runs on it must never wait for a handler on it: that handler could only run once the
// waiting one returned. The blocking forms of the tiers and the engine (acquire_ready(), get(),
// counters(), stats(), submit(), their destructors) assert that their caller is not the thread
// running their executor (runs_in_this_thread below), so a mistake fails loudly instead of hanging.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <thread>

namespace moestream {

class scheduler_thread {
  public:
    scheduler_thread();
    ~scheduler_thread();  // stop()
    scheduler_thread(const scheduler_thread&) = delete;
    scheduler_thread& operator=(const scheduler_thread&) = delete;

    boost::asio::any_io_executor executor() { return io_.get_executor(); }
    std::thread::id thread_id() const { return id_; }
    // Lets the handlers posted so far, and those they post, run to the end, then joins the
    // thread (idempotent). The io_context itself lives on until the destructor, so strands and
    // timers made on it may still be destroyed after stop(). Not from the thread itself.
    void stop();

  private:
    boost::asio::io_context io_{1};
    boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_{io_.get_executor()};
    std::thread thread_;
    std::thread::id id_;
};

// True when the calling thread is running the io_context (or thread pool) behind `ex`, inside one
// of its handlers: a blocking wait there for a handler posted to `ex` would never end. False for
// an executor of another kind (it cannot tell).
bool runs_in_this_thread(const boost::asio::any_io_executor& ex);

}  // namespace moestream
