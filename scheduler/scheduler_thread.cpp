#include "scheduler/scheduler_thread.h"

#include <pthread.h>

#include <boost/asio/thread_pool.hpp>

#include "config/assert.h"

namespace moestream {
namespace asio = boost::asio;

scheduler_thread::scheduler_thread() {
    thread_ = std::thread([this] { io_.run(); });
    id_ = thread_.get_id();
    // Named for top, perf and gdb (15 characters at most).
    (void)::pthread_setname_np(thread_.native_handle(), "moestream-sched");
}

scheduler_thread::~scheduler_thread() { stop(); }

void scheduler_thread::stop() {
    if (!thread_.joinable()) return;
    MS_ASSERT_MSG(std::this_thread::get_id() != id_, "the scheduler thread stopped from itself (it would join itself)");
    work_.reset();  // run() returns once nothing is left to run
    thread_.join();
}

bool runs_in_this_thread(const asio::any_io_executor& ex) {
    if (const auto* io = ex.target<asio::io_context::executor_type>()) return io->running_in_this_thread();
    if (const auto* pool = ex.target<asio::thread_pool::executor_type>()) return pool->running_in_this_thread();
    return false;
}

}  // namespace moestream
