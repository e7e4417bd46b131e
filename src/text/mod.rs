//! Natural-language processing: the text model zoo (`oar::text::models`).

pub mod models;
